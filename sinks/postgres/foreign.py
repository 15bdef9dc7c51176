"""Someone else's change to a sink's target, found in the epoch's txn before its rows go in.

The sink reflects its target at start-up (``reflect_table``) and checks each
epoch's rows against that reflection. The table can change while the pipeline
runs: a column dropped, retyped or added by another role. Rows written against
a reflection that is no longer true either fail on the server (a dropped
column), or, worse, go in (integers written into a column made ``text``, JSON
text into one made ``jsonb``), after which every verify refuses the table. So
every epoch txn, after its fence check and the engine's own DDL, locks the
table as its writes would (ROW EXCLUSIVE: from then on no ``ALTER TABLE`` can
commit until the txn ends, so what it reads stays true for its writes) and
reads the table's columns again, in the same round trip:

- a column the epoch writes (a key, a value, ``_epoch``) that is gone, or whose
  type is not the one the rows were checked against, stops the epoch, naming
  the table, the column and what changed; nothing is written. A restart then
  checks the table as it is against the expected state, by verify's own rule
  (``reconcile.engine.schema_plan.check_sink_columns``);
- a new column is left alone: the pipeline does not own it, never writes it
  (an insert leaves it NULL or its default, an update leaves it as it was),
  and verify does not compare it. One NOT NULL without a default is the
  server's to refuse: an insert without its value fails there, a rejection
  naming the column (``RejectedError``), and nothing of the epoch is in.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import psycopg
from psycopg import sql

from reconcile.core.schema_change import REBUILD, ForeignSchemaChange

from .schema import EPOCH_COLUMN, TableSchema

__all__ = ["check_foreign_changes"]

_COLUMNS_SQL = (
    "SELECT a.attname, format_type(a.atttypid, a.atttypmod) "
    "FROM pg_catalog.pg_attribute a "
    "WHERE a.attrelid = {table}::regclass AND a.attnum > 0 AND NOT a.attisdropped"
)


def check_foreign_changes(
    cur: psycopg.Cursor[Any], schema: TableSchema, written: Iterable[str], *, sink: str
) -> None:
    """Lock the target and refuse a change someone else made to it since ``schema`` was read.

    Args:
        cur: a cursor in the epoch's txn, after the fence check and the DDL.
        schema: the table as the epoch's rows were checked against it.
        written: the columns the epoch gives (the key and ``_epoch`` are added).
        sink: the sink's name, for the message.

    Raises:
        ForeignSchemaChange: a column the epoch writes dropped or retyped,
            naming the table, the column and what changed; the caller rolls
            the txn back, so nothing is written.
    """
    name = schema.ident.as_string(cur)
    cur.execute(
        sql.SQL("LOCK TABLE {} IN ROW EXCLUSIVE MODE; " + _COLUMNS_SQL).format(
            schema.ident, table=sql.Literal(name)
        )
    )
    cur.nextset()  # the LOCK's result first, then the columns'
    now = {str(r[0]): str(r[1]) for r in cur.fetchall()}
    wanted = dict.fromkeys((*schema.key, *written))
    if schema.has_epoch_column:
        wanted[EPOCH_COLUMN] = None
    for column in wanted:
        was = schema.columns[column].sql_type
        found = now.get(column)
        if found is None:
            raise _refused(
                schema, sink, column, "dropped",
                f"was dropped by someone else, and the pipeline writes it ({was})",
            )  # fmt: skip
        if found != was:
            raise _refused(
                schema, sink, column, "retyped",
                f"was changed by someone else from {was} to {found}, and the pipeline writes it",
            )  # fmt: skip


def _refused(
    schema: TableSchema, sink: str, column: str, change: str, what: str
) -> ForeignSchemaChange:
    # The epoch's Fatal names the sink and the epoch before this.
    return ForeignSchemaChange(
        f"table {schema.display}: column {column!r} {what}. The "
        "epoch stops rather than write into a table other than the one its rows were "
        "checked against; a restart checks the table as it is now against the expected "
        f"state. Undo the change, or {REBUILD}; nothing was written",
        sink=sink,
        table=schema.display,
        column=column,
        change=change,
    )
