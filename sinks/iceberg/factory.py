"""Build an Iceberg sink from a URI: what ``open_sink`` and recovery's registry look-up call."""

from __future__ import annotations

from collections.abc import Sequence

from sinks.iceberg.location import parse_uri
from sinks.iceberg.sink import IcebergSink

__all__ = ["open_uri", "pullable_sink"]


def open_uri(name: str, uri: str) -> IcebergSink:
    """The sink of ``iceberg://CATALOG?...`` (``sinks.iceberg.location`` lists the options)."""
    return IcebergSink(name, parse_uri(uri, default_table=name))


def pullable_sink(
    dsn: str,
    table: str,
    *,
    name: str,
    schema: str | None = None,
    key: Sequence[str] | None = None,
) -> IcebergSink:
    """The sink of table ``table`` (in namespace ``schema``) that recovery pulls from.

    What ``reconcile verify|repair`` gets from the registry: ``dsn`` is the
    ``iceberg://`` URI of the catalog; a config file's ``namespace.table``
    arrives split into ``schema`` and ``table``.
    """
    location = parse_uri(dsn, default_table=table).with_table(table, namespace=schema, key=key)
    return IcebergSink(name, location)
