"""Build a Postgres sink in one of its two modes (what the registry's ``table_sink`` names)."""

from __future__ import annotations

from typing import Any

from reconcile.core.contract import ConfigurationError
from sinks.base import split_options
from sinks.postgres.connection import PgTarget
from sinks.postgres.prepared import PreparedPostgresSink
from sinks.postgres.sink import PostgresSink

__all__ = ["open_uri", "postgres_sink"]


def postgres_sink(
    dsn: str | PgTarget, table: str, *, mode: str = "transactional", **options: Any
) -> PostgresSink:
    """Build a Postgres sink in ``mode`` 'transactional' (default) or 'prepared'.

    ``options``: ``name``, ``pipeline`` and the keywords of
    :class:`~sinks.postgres.options.PostgresOptions`.

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


def open_uri(name: str, uri: str) -> PostgresSink:
    """The sink of ``postgresql://user:pw@host/db?table=T&mode=prepared`` (``open_sink``).

    ``table`` defaults to the sink name, ``mode`` to transactional; ``schema``
    and ``state_schema`` are the sink's options of those names; other
    parameters go to libpq.

    Raises:
        ConfigurationError: for an unknown mode (and any bad option).
    """
    dsn, ours = split_options(uri, ("table", "mode", "schema", "state_schema"))
    options = {k: ours[k] for k in ("schema", "state_schema") if k in ours}
    return postgres_sink(
        dsn, ours.get("table", name), mode=ours.get("mode", "transactional"), name=name, **options
    )
