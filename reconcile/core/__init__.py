"""The core: the contract every other part of the engine is written against.

It holds the errors and outcomes (``contract``, ``results``), the sink protocol
and its capabilities (``sink``), ids, window points (``hooks``) and interrupt
points (``interrupts``), the failure classification (``decisions``), the hash
(``hashing``, ``checksum`` and their kin), keys, decimals, the progress log's
protocol, metrics and logs, the optional extras (``extras``), and the
protocols of the seams: what recovery needs from a sink's system
(``target``: ``RecoveryTarget``, ``PullableSink``), the expected-state store
as recovery reads it (``expected``), the executors' staging table
(``staged``) and the HA lease (``lease``).

It imports nothing of the engine outside itself; ``sinks`` and
``expected_state`` import nothing of ``reconcile`` but this package; the
applications (``reconcile.engine``, ``reconcile.recovery``,
``reconcile.spark``, ``reconcile.ha``, ``reconcile.testing``,
``reconcile.demo``, ``reconcile.cli``) build on all three. The import contract
in ``pyproject.toml`` (``lint-imports``) holds it.
"""
