"""On request, the target's ``_epoch`` column and its index: added together, or neither."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import errors, sql

from reconcile.core.contract import ConfigurationError

from .declared import ADD_EPOCH_COLUMN, CREATE_EPOCH_INDEX, EPOCH_COLUMN, epoch_index_name

if TYPE_CHECKING:  # sinks.postgres imports this package: no import of it at run time
    from sinks.postgres.schema import TableSchema

__all__ = ["add_epoch_column"]

_EPOCH_INDEX_SQL = """
SELECT i.indrelid = %(target)s::regclass AND i.indpred IS NULL AND i.indexprs IS NULL,
       (SELECT array_agg(a.attname::text ORDER BY k.ord)
          FROM unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
          JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum)
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
  LEFT JOIN pg_index i ON i.indexrelid = c.oid
 WHERE n.nspname = %(schema)s AND c.relname = %(index)s
"""


def add_epoch_column(conn: psycopg.Connection[Any], target: TableSchema, what: str) -> None:
    """Add the ``_epoch bigint`` column to the target, and its index, if missing.

    Scoped recovery pulls the rows of epochs after the newest marker
    (``_epoch > n``): without an index that is a scan of the whole table, and
    recovery would cost what the table costs, not what diverged.

    Raises:
        ConfigurationError: the role may not add them (it must own the table,
            and PostgreSQL asks for CREATE on its schema for the index), or a
            relation of the index's name exists and is not that index. Either
            way nothing was added.
    """
    column = sql.Identifier(EPOCH_COLUMN)
    index = epoch_index_name(target.table)
    try:
        with conn.transaction():  # the column and its index, or neither
            conn.execute(sql.SQL(ADD_EPOCH_COLUMN).format(target=target.ident, column=column))
            conn.execute(
                sql.SQL(CREATE_EPOCH_INDEX).format(
                    index=sql.Identifier(index), target=target.ident, column=column
                )
            )
            _check_epoch_index(conn, target, index, what)
    except errors.InsufficientPrivilege as err:
        raise ConfigurationError(
            f"{what}: cannot add the {EPOCH_COLUMN} column and its index {index} to "
            f"{target.display}: {str(err).strip()}. create_epoch_column=True needs the table's "
            f"ownership and CREATE on schema {target.schema} (for the index), or add them "
            f"once as the owner: ALTER TABLE {target.display} ADD COLUMN {EPOCH_COLUMN} bigint; "
            f"CREATE INDEX ON {target.display} ({EPOCH_COLUMN}); nothing was added",
            table=target.display,
        ) from None


def _check_epoch_index(
    conn: psycopg.Connection[Any], target: TableSchema, index: str, what: str
) -> None:
    row = conn.execute(
        _EPOCH_INDEX_SQL,
        {"target": target.ident.as_string(conn), "schema": target.schema, "index": index},
    ).fetchone()
    if row is None or not row[0] or list(row[1] or []) != [EPOCH_COLUMN]:
        raise ConfigurationError(
            f"{what}: {target.schema}.{index}, the name of the {EPOCH_COLUMN} index of "
            f"{target.display}, is taken by another relation; rename or drop it, then start "
            "again; nothing was added",
            table=target.display,
        )
