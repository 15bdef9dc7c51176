"""Build an SQL sink from a URI (what ``open_sink`` calls for an SQLAlchemy URL)."""

from __future__ import annotations

from sinks.base import split_options
from sinks.sql.sink import SqlSink

__all__ = ["open_uri"]


def open_uri(name: str, uri: str) -> SqlSink:
    """The sink of ``sqlite:///path?table=T`` (any SQLAlchemy URL).

    ``table`` defaults to the sink name; ``schema`` and ``state_schema`` are
    the sink's options of those names; other parameters go to the driver.

    Raises:
        ConfigurationError: not an SQLAlchemy URL (the URL is not shown).
    """
    url, ours = split_options(uri, ("table", "schema", "state_schema"))
    return SqlSink(
        url,
        ours.get("table", name),
        name=name,
        schema=ours.get("schema"),
        state_schema=ours.get("state_schema"),
    )
