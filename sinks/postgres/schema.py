"""Reflection of a sink's target table: columns, types, nullability and the key."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from reconcile.contract import ConfigurationError

__all__ = ["EPOCH_COLUMN", "Column", "TableSchema", "reflect_table"]

# The column in which the sink records the last epoch that wrote each row; the
# scoped pull-and-diff recovery reads it.
EPOCH_COLUMN = "_epoch"

# pg type name -> the kind of Python value accepted for it (see staging.py).
_KINDS = {
    "int2": "int",
    "int4": "int",
    "int8": "int",
    "numeric": "numeric",
    "float4": "float",
    "float8": "float",
    "bool": "bool",
    "text": "text",
    "varchar": "text",
    "bpchar": "text",
    "name": "text",
    "citext": "text",
    "uuid": "uuid",
    "date": "date",
    "timestamp": "timestamp",
    "timestamptz": "timestamptz",
    "time": "time",
    "json": "json",
    "jsonb": "json",
    "bytea": "bytes",
    "interval": "interval",
}

_COLUMNS_SQL = """
SELECT a.attname, t.typname, format_type(a.atttypid, a.atttypmod), a.atttypmod,
       a.attnotnull, a.atthasdef OR a.attidentity <> '' OR a.attgenerated <> '', a.atttypid
  FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
 WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped
 ORDER BY a.attnum
"""

_KEYS_SQL = """
SELECT i.indisprimary, array_agg(a.attname ORDER BY k.ord)
  FROM pg_index i
  CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
  JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
 WHERE i.indrelid = %s AND i.indisunique AND i.indpred IS NULL AND i.indexprs IS NULL
 GROUP BY i.indexrelid, i.indisprimary
 ORDER BY i.indisprimary DESC, i.indexrelid
"""


@dataclass(frozen=True)
class Column:
    """One column of the target table as the server describes it."""

    name: str
    typname: str
    sql_type: str  # format_type(): server-quoted, e.g. 'character varying(10)'
    typmod: int
    not_null: bool
    has_default: bool
    type_oid: int

    @property
    def kind(self) -> str:
        """The value kind accepted for this column ('int', 'text', ... or 'other')."""
        return _KINDS.get(self.typname, "other")

    @property
    def max_length(self) -> int | None:
        """The declared length of varchar(n) / char(n), else None."""
        if self.typname in ("varchar", "bpchar") and self.typmod > 4:
            return self.typmod - 4
        return None


@dataclass(frozen=True)
class TableSchema:
    """The target table: qualified name, columns by name, and the key used for upserts."""

    schema: str
    table: str
    columns: dict[str, Column]
    key: tuple[str, ...]

    @property
    def ident(self) -> sql.Composable:
        """The quoted, schema-qualified table name."""
        return sql.Identifier(self.schema, self.table)

    @property
    def display(self) -> str:
        """The table name as it appears in messages."""
        return f"{self.schema}.{self.table}"

    @property
    def has_epoch_column(self) -> bool:
        """True if the table has the ``_epoch`` column that the sink fills in."""
        return EPOCH_COLUMN in self.columns


def reflect_table(
    conn: psycopg.Connection[Any],
    schema: str | None,
    table: str,
    key: tuple[str, ...] | None = None,
) -> TableSchema:
    """Read the target table's definition from the catalog.

    Args:
        conn: an open connection.
        schema: the table's schema; None means the session's current schema.
        table: the table name, unquoted (any characters).
        key: the columns that identify a row; default the primary key. They
            must be covered by a unique index, since upserts use ON CONFLICT.

    Raises:
        ConfigurationError: naming the table if it does not exist, has no
            usable key, or ``key`` names unknown columns.
    """
    with conn.cursor() as cur:
        if schema is None:
            row = cur.execute("SELECT current_schema()").fetchone()
            schema = str(row[0]) if row and row[0] else "public"
        found = cur.execute(
            "SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relname = %s AND c.relkind IN ('r', 'p')",
            (schema, table),
        ).fetchone()
        if found is None:
            raise ConfigurationError(
                f"postgres sink: target table {schema}.{table} does not exist "
                "(or is not a table); nothing was written",
                table=f"{schema}.{table}",
            )
        oid = found[0]
        columns = {
            r[0]: Column(r[0], r[1], r[2], r[3], r[4], r[5], r[6])
            for r in cur.execute(_COLUMNS_SQL, (oid,)).fetchall()
        }
        unique_keys = [(bool(r[0]), tuple(r[1])) for r in cur.execute(_KEYS_SQL, (oid,))]
    display = f"{schema}.{table}"
    if key is not None:
        unknown = [c for c in key if c not in columns]
        if unknown:
            raise ConfigurationError(
                f"postgres sink: key column {unknown[0]!r} is not a column of table {display}",
                table=display,
                column=unknown[0],
            )
        if not any(set(k) == set(key) for _, k in unique_keys):
            raise ConfigurationError(
                f"postgres sink: key {list(key)} of table {display} is not covered by a "
                "primary key or unique index; upserts need one (ON CONFLICT)",
                table=display,
            )
        chosen = tuple(key)
    elif unique_keys and unique_keys[0][0]:
        chosen = unique_keys[0][1]
    else:
        raise ConfigurationError(
            f"postgres sink: table {display} has no primary key; give key=(...) columns "
            "covered by a unique index",
            table=display,
        )
    return TableSchema(schema=schema, table=table, columns=columns, key=chosen)
