"""The target's columns as recovery sees them, and how a pull selects each of them.

A column's recovery kind comes from its ``pg_type.typname`` (``arrow_types``);
a pull selects a value as text where the expected state keeps it as text
(``wants_text``: numeric, uuid, json and jsonb as jsonb's text), a uuid as its 16 bytes where the
store keeps bytes, and every other column as it is (a ``char(n)`` with its
padding, which a cast to text would drop), so that Arrow gets each value in
the expected state's own type and form.
"""

from __future__ import annotations

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
from psycopg import sql

from reconcile.core.conform import SinkColumn, wants_text

from . import arrow_types
from .schema import Column, TableSchema

__all__ = ["recovery_kind", "select_list", "sink_columns"]


def recovery_kind(column: Column) -> str:
    """The column's recovery kind (``reconcile.core.conform.SinkColumn``), by pg_type.typname."""
    return arrow_types.recovery_kind(column.typname)


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
        if column.kind == "jsonb" and wants_text(column.kind, field.type):
            # json as jsonb's text too: compared by meaning, as the store holds it.
            parts.append(sql.SQL("{}::jsonb::text AS {}").format(ident, sql.Identifier(field.name)))
        elif wants_text(column.kind, field.type):
            parts.append(sql.SQL("{}::text AS {}").format(ident, sql.Identifier(field.name)))
        elif column.kind == "uuid":  # a 16-byte binary in the expected state
            parts.append(
                sql.SQL("pg_catalog.uuid_send({}) AS {}").format(ident, sql.Identifier(field.name))
            )
        else:
            parts.append(ident)
    return sql.SQL(", ").join(parts)
