"""PostgreSQL exactly-once sink: transactional and prepared-transaction (2PC) modes."""

from __future__ import annotations

from typing import Any

from reconcile.contract import ConfigurationError

from .connection import PgTarget, redact_text
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


def postgres_sink(
    dsn: str | PgTarget,
    table: str,
    *,
    mode: str = "transactional",
    **options: Any,
) -> PostgresSink:
    """Build a Postgres sink in ``mode`` 'transactional' (default) or 'prepared'.

    ``options``: ``name``, ``pipeline`` and the keywords of :class:`PostgresOptions`.

    Raises:
        ConfigurationError: for an unknown mode (and any bad option).
    """
    if mode == "transactional":
        return PostgresSink(dsn, table, **options)
    if mode == "prepared":
        return PreparedPostgresSink(dsn, table, **options)
    raise ConfigurationError(
        f"postgres sink: mode must be 'transactional' or 'prepared', got {mode!r}"
    )
