"""Schema evolution of a Postgres sink's target: ``ALTER TABLE`` inside the epoch's txn.

The commit cycle hands the sink a :class:`~reconcile.core.schema_change.SchemaChange`
(``evolve_schema``) before it stages an epoch whose rows carry it. The sink then:

- validates the epoch's rows against the table as it will be (``projected``):
  the new columns as they will be declared;
- in the epoch's txn, after the fence check (so a zombie never alters the
  table), reads the columns again (the txn's own view) and makes only what is
  missing (``evolve_in_txn``): ``ADD COLUMN`` (nullable, no default: a catalog
  change, no rewrite), or ``ALTER COLUMN ... TYPE`` for a longer ``varchar`` or
  ``text`` (no rewrite either) or a wider number (``USING``; it rewrites the
  table). A replay of the epoch after a crash finds the columns there and
  alters nothing. The DDL commits or rolls back with the epoch's rows and
  marker: no epoch is half in.

A column the epoch brings that the table has already, though the store has not,
was made by someone else (the engine makes a sink column only in the txn of
the epoch that the store commits first): the pipeline takes it over only if
verify can read it as the store's type and it holds no value yet (a column a
DBA made ahead of the new logic); one of another type (``jsonb`` for JSON
text) or with values someone else wrote is refused, naming it, before
anything is written: taken over, it would be refused by every verify, or its
values reported as drift and overwritten by a repair.

``ALTER TABLE`` takes an ACCESS EXCLUSIVE lock on the table until the epoch's
txn ends: readers of the table wait that long (a rewrite makes it as long as
the table is big). Identifiers are quoted; the type names come from the table
below, never from the caller's text.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace
from typing import Any

import psycopg
import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
from psycopg import sql

from reconcile.core.conform import fits
from reconcile.core.schema_change import (
    REBUILD,
    ForeignSchemaChange,
    SchemaChange,
    SchemaChangeRefused,
    declared_length,
    declared_sql_type,
    widens,
)

from .arrow_types import arrow_type
from .pull_columns import recovery_kind
from .schema import Column, TableSchema

__all__ = ["evolve_in_txn", "pg_column", "projected"]

# Arrow type -> (typname, format_type() spelling, type oid): the columns the
# sink adds, and the types it widens to.
_ARROW_PG = {
    pa.int16(): ("int2", "smallint", 21),
    pa.int32(): ("int4", "integer", 23),
    pa.int64(): ("int8", "bigint", 20),
    pa.float32(): ("float4", "real", 700),
    pa.float64(): ("float8", "double precision", 701),
    pa.bool_(): ("bool", "boolean", 16),
    pa.string(): ("text", "text", 25),
    pa.large_string(): ("text", "text", 25),
    pa.date32(): ("date", "date", 1082),
    pa.timestamp("us"): ("timestamp", "timestamp without time zone", 1114),
    pa.timestamp("us", tz="UTC"): ("timestamptz", "timestamp with time zone", 1184),
    pa.binary(): ("bytea", "bytea", 17),
}


def pg_column(field: pa.Field, *, table: str) -> Column:
    """The column a field becomes in the sink (nullable, no default).

    A string field may declare ``varchar(n)`` or ``text`` as metadata
    ``sql_type``; other fields take their Arrow type's column type.

    Raises:
        SchemaChangeRefused: an Arrow type the sink has no column type for.
    """
    dtype = field.type
    if pa.types.is_decimal(dtype) and 0 <= dtype.scale <= dtype.precision <= 1000:
        typmod = ((dtype.precision << 16) | dtype.scale) + 4
        spelled = f"numeric({dtype.precision},{dtype.scale})"
        return Column(field.name, "numeric", spelled, typmod, False, False, 1700)
    if pa.types.is_string(dtype) or pa.types.is_large_string(dtype):
        length = declared_length(declared_sql_type(field))
        if isinstance(length, int) and not isinstance(length, bool):
            spelled = f"character varying({length})"
            return Column(field.name, "varchar", spelled, length + 4, False, False, 1043)
    known = _ARROW_PG.get(dtype)
    if known is None:
        raise SchemaChangeRefused(
            f"postgres sink: table {table}: column {field.name!r} of Arrow type {dtype} has no "
            f"column type the sink can add or widen to: {REBUILD}; nothing was written",
            table=table,
            column=field.name,
        )
    typname, spelled, oid = known
    return Column(field.name, typname, spelled, -1, False, False, oid)


def _holds(column: Column, wanted: Column) -> bool | None:
    """Whether ``column`` holds every value of ``wanted`` (None: it is the same type)."""
    if column.sql_type == wanted.sql_type:
        return None
    if column.kind == "text" and wanted.kind == "text":
        had, want = column.max_length, wanted.max_length
        return had is None or (want is not None and had >= want)
    have, need = arrow_type(column), arrow_type(wanted)
    if have is None or need is None:
        return False
    return bool(have.equals(need) or widens(need, have))


def _plan(schema: TableSchema, change: SchemaChange) -> list[tuple[str, Column, bool]]:
    """What the change needs of the table: (column, its new definition, whether it exists).

    Raises:
        SchemaChangeRefused: a column the table has that cannot become the
            change's type in place (a narrowing, another kind), naming it.
    """
    steps = []
    for name in change.columns:
        wanted = pg_column(change.after.field(name), table=schema.display)
        column = schema.columns.get(name)
        if column is None:
            steps.append((name, wanted, False))
            continue
        if name in change.added:
            # The column is there: made by this sink in an earlier txn of the
            # change, or by someone else (``_foreign``); nothing to add.
            _check_takeover(schema, column, change.after.field(name))
            continue
        holds = _holds(column, wanted)
        if holds is None:
            continue
        have, need = arrow_type(column), arrow_type(wanted)
        longer = column.kind == "text" and wanted.kind == "text" and not holds
        wider = have is not None and need is not None and widens(have, need)
        if longer or wider:
            steps.append((name, wanted, True))
        elif not holds:
            raise SchemaChangeRefused(
                f"postgres sink: table {schema.display}: column {name!r} is "
                f"{column.sql_type}, which cannot become {wanted.sql_type} in place (not a "
                f"widening): {REBUILD}; nothing was written",
                table=schema.display,
                column=name,
            )
    return steps


def _check_takeover(schema: TableSchema, column: Column, field: pa.Field) -> None:
    """Refuse to take over a column someone else made that verify cannot read as ``field``.

    Raises:
        ForeignSchemaChange: naming the table, the column and both types.
    """
    if fits(recovery_kind(column), field.type):
        return
    raise ForeignSchemaChange(
        f"postgres sink: table {schema.display}: column {column.name!r}, new to the pipeline, "
        f"is in the table already as {column.sql_type}, which the expected state cannot hold "
        f"as {field.type} and verify cannot compare: someone else added it. Drop or rename it "
        "(the pipeline then adds its own), or give the pipeline's column another name; "
        "nothing was written",
        table=schema.display,
        column=column.name,
        change="added",
    )


def _check_empty(cur: psycopg.Cursor[Any], schema: TableSchema, name: str) -> None:
    """Refuse to take over a column someone else made that holds values already.

    The store reads the rows written before the epoch as NULL in it: values
    another writer put there would be drift from the first verify on, and a
    repair would overwrite them. The probe stops at the first value.

    Raises:
        ForeignSchemaChange: naming the table and the column.
    """
    found = cur.execute(
        sql.SQL("SELECT EXISTS (SELECT FROM {} WHERE {} IS NOT NULL)").format(
            schema.ident, sql.Identifier(name)
        )
    ).fetchone()
    if found is None or not found[0]:
        return
    raise ForeignSchemaChange(
        f"postgres sink: table {schema.display}: column {name!r}, new to the pipeline, is in "
        "the table already and holds values someone else wrote, which the expected state "
        "does not have (verify would report every such row, and a repair overwrite it). "
        "Empty it, drop or rename it, or give the pipeline's column another name; nothing "
        "was written",
        table=schema.display,
        column=name,
        change="added",
    )


def projected(schema: TableSchema, change: SchemaChange) -> TableSchema:
    """The table as it will be once ``change`` is made: what the epoch's rows are checked by.

    Raises:
        SchemaChangeRefused: as ``_plan``.
    """
    columns = dict(schema.columns)
    for name, wanted, _ in _plan(schema, change):
        old = columns.get(name)
        columns[name] = wanted if old is None else replace(
            old, typname=wanted.typname, sql_type=wanted.sql_type, typmod=wanted.typmod,
            type_oid=wanted.type_oid,
        )  # fmt: skip
    return replace(schema, columns=columns)


def evolve_in_txn(
    cur: psycopg.Cursor[Any],
    schema: TableSchema,
    change: SchemaChange,
    owned: Collection[str] = (),
) -> bool:
    """Make what ``change`` needs of the table, in the epoch's txn; True if any DDL ran.

    ``schema`` is the table as this txn reads it (a replay finds the columns
    there: nothing runs). ``owned``: the columns this sink added, or took
    over, in an earlier txn of the change (their values are the pipeline's).

    Raises:
        SchemaChangeRefused: as ``_plan``, or a column someone else made that
            holds values (``ForeignSchemaChange``); the caller rolls the txn back.
    """
    steps = _plan(schema, change)
    for name in change.added:
        if name in schema.columns and name not in owned:
            _check_empty(cur, schema, name)
    ran = False
    for name, wanted, exists in steps:
        target = sql.SQL(wanted.sql_type)  # from _ARROW_PG / numeric / varchar above
        if not exists:
            statement = sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS {} {}").format(
                schema.ident, sql.Identifier(name), target
            )
        elif wanted.kind == "text":
            # varchar(n) -> varchar(m > n) or text: binary-compatible, no rewrite.
            statement = sql.SQL("ALTER TABLE {} ALTER COLUMN {} TYPE {}").format(
                schema.ident, sql.Identifier(name), target
            )
        else:
            # A wider number: every value converts exactly; the table is rewritten.
            statement = sql.SQL("ALTER TABLE {} ALTER COLUMN {} TYPE {} USING {}::{}").format(
                schema.ident, sql.Identifier(name), target, sql.Identifier(name), target
            )
        cur.execute(statement)
        ran = True
    return ran
