"""A sink of Delta tables (delta-rs): each epoch one Delta commit, tokened by its txn id.

The sink is ``sinks.delta.sink.DeltaSink``; ``backend`` declares it to ``sinks.registry``.
"""
