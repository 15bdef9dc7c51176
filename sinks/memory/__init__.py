"""A process-local sink (tests, examples): the two-phase-commit contract held in memory.

The sink is ``sinks.memory.sink.MemorySink``; ``backend`` declares it to ``sinks.registry``.
"""
