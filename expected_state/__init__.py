"""Expected-state store on Delta tables (delta-rs): what every sink must hold after each epoch.

This package builds on ``reconcile.core`` only. The core's parent package,
``reconcile``, exports the commit cycle and ``recover``, which build on this
package: so the core is imported here, before any module of this package, and
``reconcile`` is whole before one of them starts. Otherwise ``import
expected_state.delta_files`` in a fresh interpreter (a Spark worker) would
have ``reconcile`` import this package's other modules while ``delta_files``
is still half-run.
"""

import reconcile.core  # noqa: F401  (first: see above)
