"""PostgreSQL exactly-once sink: transactional and prepared-transaction (2PC) modes.

Nothing is imported here: ``backend`` declares the backend to ``sinks.registry``
and must be readable without the optional dependencies this backend needs
(``pip install 'reconcile-engine[postgres]'``).
Import the sink from its module (``sinks.postgres.sink.PostgresSink``).
"""
