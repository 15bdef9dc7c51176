"""A sink of files on a local disk: each epoch one batch file, committed by an atomic rename.

The sink is ``sinks.files.sink.FileSink``; ``backend`` declares it to ``sinks.registry``.
"""
