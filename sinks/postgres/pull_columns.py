"""The target's columns as recovery sees them, and how a pull selects each of them.

A column's recovery kind comes from its ``pg_type.typname``; a pull selects
a value as text where the expected state keeps it as text (``wants_text``), a
uuid as its 16 bytes, and every other column as it is, so that Arrow gets
each value in the expected state's own type.
"""

from __future__ import annotations

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
from psycopg import sql

from reconcile.core.conform import SinkColumn, wants_text

from .schema import Column, TableSchema

__all__ = ["recovery_kind", "select_list", "sink_columns"]

_KINDS = {
    "int2": "int",
    "int4": "int",
    "int8": "int",
    "numeric": "numeric",
    "float8": "float8",
    "float4": "float4",
    "bool": "bool",
    "text": "text",
    "varchar": "text",
    "uuid": "uuid",
    "date": "date",
    "timestamp": "timestamp",
    "timestamptz": "timestamptz",
    "bytea": "bytes",
}


def recovery_kind(column: Column) -> str:
    """The column's recovery kind (``reconcile.core.conform.SinkColumn``), by pg_type.typname."""
    return _KINDS.get(column.typname, "other")


def sink_columns(table: TableSchema) -> dict[str, SinkColumn]:
    """The target's columns as recovery sees them (kind by pg_type.typname)."""
    return {
        name: SinkColumn(name, recovery_kind(col), col.sql_type)
        for name, col in table.columns.items()
    }


def select_list(schema: pa.Schema, columns: dict[str, SinkColumn]) -> sql.Composable:
    """The select list of a pull of table alias ``t``: ``schema``'s columns, in its order."""
    parts: list[sql.Composable] = []
    for field in schema:
        column = columns[field.name]
        ident = sql.Identifier("t", field.name)
        if wants_text(column.kind, field.type):
            parts.append(sql.SQL("{}::text AS {}").format(ident, sql.Identifier(field.name)))
        elif column.kind == "uuid":  # a 16-byte binary in the expected state
            parts.append(
                sql.SQL("pg_catalog.uuid_send({}) AS {}").format(ident, sql.Identifier(field.name))
            )
        else:
            parts.append(ident)
    return sql.SQL(", ").join(parts)
