"""PostgreSQL exactly-once sink: transactional and prepared-transaction (2PC) modes.

Nothing is imported here: ``backend`` declares the backend to ``sinks.registry``
and must be readable without the optional dependencies this backend needs
(``pip install 'reconcile-engine[postgres]'``).
Its public names are imported on first use (the sink: ``sinks.postgres.sink.PostgresSink``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sinks.base import lazy_exports

if TYPE_CHECKING:
    from .connection import PgTarget, redact_text
    from .factory import postgres_sink
    from .options import PostgresKeywords, PostgresOptions
    from .prepared import PreparedPostgresSink
    from .sink import PostgresSink

__all__ = [
    "PgTarget",
    "PostgresKeywords",
    "PostgresOptions",
    "PostgresSink",
    "PreparedPostgresSink",
    "postgres_sink",
    "redact_text",
]

__getattr__ = lazy_exports(
    __name__,
    {
        "PgTarget": "connection",
        "PostgresKeywords": "options",
        "PostgresOptions": "options",
        "PostgresSink": "sink",
        "PreparedPostgresSink": "prepared",
        "postgres_sink": "factory",
        "redact_text": "connection",
    },
)
