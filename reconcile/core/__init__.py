"""The core: the contract every other part of the engine is written against.

It holds the errors and outcomes (``contract``, ``results``), the sink protocol
and its capabilities (``sink``), ids, window points (``hooks``) and interrupt
points (``interrupts``), the failure classification (``decisions``), the hash
(``hashing``, ``checksum`` and their kin), keys, decimals, staged epochs, the
progress log's protocol, metrics and logs, and the protocols of the seams
(``target``: what recovery needs from a sink's system).

It imports nothing of the engine outside itself; ``sinks`` and
``expected_state`` import only this package; the applications
(``reconcile.engine``, ``reconcile.recovery``, ``reconcile.spark``,
``reconcile.ha``, ``reconcile.cli``, ``reconcile.demo``) build on all three.
"""
