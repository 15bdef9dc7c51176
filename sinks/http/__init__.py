"""A sink that posts each epoch to an HTTP endpoint that speaks the prepare/commit protocol.

The sink is ``sinks.http.sink.HttpSink``; ``backend`` declares it to ``sinks.registry``.
"""
