"""Sinks: the two-phase-commit contract and its implementations (memory, files, http, ...).

This package builds on ``reconcile.core`` only. The core's parent package,
``reconcile``, exports ``recover``, which finds sinks through
``sinks.registry``: so the core is imported here, before any module of this
package, and ``reconcile`` is whole before one of them starts (``import
sinks.delta.sink`` first in a Spark worker must not find ``sinks.registry``
half-run).
"""

import reconcile.core  # noqa: F401  (first: see above)
