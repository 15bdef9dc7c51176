"""A transactional exactly-once sink, and pull-and-diff recovery, for any SQLAlchemy database.

Nothing is imported here: ``backend`` declares the backend to ``sinks.registry``
and must be readable without the optional dependencies this backend needs
(``pip install 'reconcile-engine[sql]'``).
Import the sink from its module (``sinks.sql.sink.SqlSink``).
"""
