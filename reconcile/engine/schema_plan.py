"""The schema an epoch's outputs bring to a store table, and the change it asks for.

The commit cycle stages each epoch into the store's types (``ExpectedState.stage``).
Before that it compares what the epoch brings with the store table's schema:

- the columns of the epoch's upserts (an Arrow table's columns, or every
  column a row names): a column the table lacks is a new column, typed by the
  Arrow table, else by the sink's column of that name, else inferred from the
  values (widened as for a first epoch); a table column the upserts lack is a
  dropped column (refused);
- the schema given with ``schemas=`` for the sink: its types and its fields'
  ``sql_type`` metadata are the declared target (a widening, a longer
  ``varchar``); an Arrow table's types alone declare nothing (an int64 array
  for an int32 column is converted value by value, as always).

An epoch without upserts brings no columns, so it asks for no change.
``reconcile.core.schema_change.plan_schema_change`` decides what evolves.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]

from expected_state.column_types import widen_inferred
from reconcile.core.conform import SinkColumn, column_mismatch
from reconcile.core.contract import Change, InvalidInputError
from reconcile.core.schema_change import (
    REBUILD,
    SQL_TYPE_KEY,
    ForeignSchemaChange,
    SchemaChange,
    SchemaChangeRefused,
    added_epoch,
    plan_schema_change,
)

__all__ = [
    "brought_schema",
    "check_sink_columns",
    "hand_schema_change",
    "pending_sink_change",
    "plan_epoch_change",
    "with_declared_types",
]

_NOT_COLUMNS = ("_op", "_seq")


def _inferred(name: str, values: list[Any], table: str) -> pa.DataType:
    try:
        dtype = widen_inferred(pa.array(values).type)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:
        raise InvalidInputError(
            f"table {table!r}: new column {name!r}: its values do not convert to one Arrow "
            f"type ({exc}); declare it in schemas=; nothing was written",
            table=table,
            column=name,
        ) from None
    if pa.types.is_null(dtype):
        raise InvalidInputError(
            f"table {table!r}: new column {name!r} is NULL in every upsert of the epoch that "
            "brings it, so its type cannot be inferred; declare it in schemas= (a nullable "
            "field); nothing was written",
            table=table,
            column=name,
        )
    return dtype


def brought_schema(
    rows: list[Change] | pa.Table,
    sink_types: pa.Schema | None,
    table: str,
    known: pa.Schema | None = None,
) -> pa.Schema | None:
    """The columns the epoch's upserts bring, typed; None for an epoch without upserts.

    ``known`` (the store's schema) types the columns it has: only a new
    column's values are gathered to infer its type, so an epoch without a new
    column costs one pass over its rows' column names.
    """
    if isinstance(rows, pa.Table):
        if rows.num_columns == 0:
            return None
        return pa.schema([f for f in rows.schema if f.name not in _NOT_COLUMNS])
    upserts = [change.row for change in rows if change.op == "upsert"]
    if not upserts:
        return None
    names = list(dict.fromkeys(name for row in upserts for name in row))
    fields = []
    for name in names:
        if known is not None and known.get_field_index(name) >= 0:
            fields.append(known.field(name))
        elif sink_types is not None and sink_types.get_field_index(name) >= 0:
            fields.append(sink_types.field(name))
        else:
            values = [row.get(name) for row in upserts]
            fields.append(pa.field(name, _inferred(name, values, table)))
    return pa.schema(fields)


def plan_epoch_change(
    store: pa.Schema,
    brought: pa.Schema | None,
    declared: pa.Schema | None,
    keys: Sequence[str],
    sink_types: pa.Schema | None,
    *,
    table: str,
) -> SchemaChange | None:
    """The change the epoch asks of a store table; None if none.

    Args:
        store: the store table's user schema now.
        brought: what the epoch's upserts bring (``brought_schema``), or None.
        declared: the sink's ``schemas=`` entry, or None.
        keys: the key columns.
        sink_types: the sink table's columns (their ``sql_type`` says the
            sink's type now, against which a declared ``sql_type`` is compared).
        table: how messages name the table.

    Raises:
        SchemaChangeRefused: naming the table and the column (see
            ``plan_schema_change``); nothing was written.
    """
    if brought is None and declared is None:
        return None
    nothing_new = (
        declared is None
        and brought is not None
        and all(store.get_field_index(f.name) >= 0 for f in brought)
        and all(brought.get_field_index(k) >= 0 for k in keys)
    )
    if nothing_new:
        # The epoch's conversion checks its columns and values as always (a
        # value column missing, or a value that does not fit, is refused
        # there, naming it).
        return None

    def now(field: pa.Field) -> pa.Field:
        # The store keeps no sink type: the sink's column says it.
        if sink_types is not None and sink_types.get_field_index(field.name) >= 0:
            sql_type = (sink_types.field(field.name).metadata or {}).get(SQL_TYPE_KEY)
            if sql_type is not None:
                return field.with_metadata({SQL_TYPE_KEY: sql_type})
        return field

    def target(field: pa.Field) -> pa.Field:
        if declared is not None and declared.get_field_index(field.name) >= 0:
            return declared.field(field.name)
        return now(field)

    before = pa.schema([now(f) for f in store])
    after = [target(f) for f in store if brought is None or brought.get_field_index(f.name) >= 0]
    if brought is not None:
        after += [target(f) for f in brought if store.get_field_index(f.name) < 0]
    return plan_schema_change(before, pa.schema(after), keys, table=table)


def with_declared_types(sink_types: pa.Schema, after: pa.Schema) -> pa.Schema:
    """The sink's column types once ``after`` is in: its declared ``sql_type`` taken."""
    fields = {f.name: f for f in sink_types}
    for field in after:
        if (field.metadata or {}).get(SQL_TYPE_KEY) is not None or field.name not in fields:
            fields[field.name] = field
    return pa.schema(list(fields.values()))


def hand_schema_change(sink: object, name: str, change: SchemaChange) -> None:
    """Give a sink the change its table must make in the epoch (``evolve_schema``).

    Only a sink that says how (the Postgres sink: ``ALTER TABLE`` in its epoch
    txn, after its fence check) can take one; the SQL (MariaDB), Iceberg,
    file, HTTP and memory sinks have no ``evolve_schema`` and are refused.

    Raises:
        SchemaChangeRefused: naming the sink and the column; nothing was written.
    """
    evolve = getattr(sink, "evolve_schema", None)
    if evolve is None:
        column = change.columns[0]
        raise SchemaChangeRefused(
            f"sink {name!r} ({type(sink).__name__}) cannot evolve its table's schema in "
            f"place, and the epoch {change.describe()} (column {column!r}): {REBUILD}, or "
            "make the change by hand on the sink and give the store's schema (schemas=); "
            "nothing was written",
            sink=name,
            table=change.table,
            column=column,
        )
    evolve(change)


def pending_sink_change(
    store: pa.Schema, sink_columns: Collection[str], *, table: str, sink: str
) -> SchemaChange | None:
    """A change the store made and the sink's table lacks: its columns, to add on restart.

    After a crash between the store's commit of an epoch that added a column
    and the sink's commit of that epoch, the store has the column and the sink
    does not; the epoch's replay must add it first. Only a column that an
    epoch added (``ADDED_EPOCH``) can be left so: every column the store table
    was created with was in the sink's table when its first epoch was
    written, so a sink that lacks one lost it to someone else, and adding it
    back would fill every row with NULL. That is refused, naming it. (Of an
    added column, the sink that can evolve checks its own markers: if it holds
    the epoch that added it, it was dropped too.) A store column of another
    type was checked by ``check_store_types`` and ``check_sink_columns``.

    Args:
        store: the store table's user schema (its fields' metadata say which
            epoch added them).
        sink_columns: the names of every column of the sink's table.
        table: the store table, for messages.
        sink: the sink's name, for messages.

    Raises:
        ForeignSchemaChange: a column the store table was created with is
            missing from the sink's table, naming it; nothing was written.
    """
    missing = [f for f in store if f.name not in sink_columns]
    if not missing:
        return None
    for field in missing:
        if added_epoch(field) is None:
            raise ForeignSchemaChange(
                f"sink {sink!r}: column {field.name!r} ({field.type}) is missing from the sink's "
                f"table, though the expected state (table {table!r}) has had it since the "
                "pipeline's first epoch: someone dropped it. The pipeline does not add it back "
                "with every row NULL: restore it with its values (then verify), or "
                f"{REBUILD}; nothing was written",
                sink=sink,
                table=table,
                column=field.name,
                change="dropped",
            )
    present = [f for f in store if f.name in sink_columns]
    return SchemaChange(table, pa.schema(present), store, tuple(f.name for f in missing), ())


def check_sink_columns(
    store: pa.Schema, columns: dict[str, SinkColumn], *, table: str, sink: str
) -> None:
    """Refuse at start-up a sink column that verify would refuse: the same rule, before writing.

    A store column that the sink's table has must be one verify can read as
    the store's type (``reconcile.core.conform.fits``); one it cannot (a
    ``text`` column someone made ``jsonb``, a ``numeric`` made ``bigint``)
    would be written to and then refused by every verify. Columns the sink
    lacks are ``pending_sink_change``'s.

    Raises:
        ForeignSchemaChange: naming the column and both types; nothing was written.
    """
    mismatch = column_mismatch(pa.schema([f for f in store if f.name in columns]), columns)
    if mismatch is None:
        return
    field, found = mismatch
    assert found is not None
    raise ForeignSchemaChange(
        f"sink {sink!r}: column {field.name!r} is {found.sql_type} in the sink's table but "
        f"{field.type} in the expected state (table {table!r}), which verify cannot compare "
        "(it would refuse the table from now on): its type was changed by someone else. "
        f"Change it back, or {REBUILD}; nothing was written",
        sink=sink,
        table=table,
        column=field.name,
        change="retyped",
        sink_type=found.sql_type,
        expected_type=str(field.type),
    )
