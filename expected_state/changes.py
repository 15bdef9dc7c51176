"""Turn an epoch's changes (Change objects or an Arrow table with an ``_op`` column) into Arrow."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
import pyarrow.compute as pc  # type: ignore[import-untyped, unused-ignore]

from expected_state.column_types import infer_user_schema, sql_type, type_names
from expected_state.forms import check_refused, formed, formed_values
from expected_state.merge import last_per_key
from reconcile.core.contract import Change, InvalidInputError, RowsRejectedError
from reconcile.core.decimals import DecimalFitError, check_decimal, check_decimal_array
from reconcile.core.hashing import row_hash_arrow
from reconcile.core.value_forms import forms_of

__all__ = [
    "OP_COLUMN",
    "RESERVED_COLUMNS",
    "EpochChanges",
    "change_rows",
    "conform_upserts",
    "normalize_changes",
]

OP_COLUMN = "_op"
RESERVED_COLUMNS = ("_row_hash", "_epoch")


@dataclass(frozen=True, slots=True)
class EpochChanges:
    """One epoch's net changes: at most one operation per key, the last one given.

    Attributes:
        upserts: full rows (the user schema) to insert or replace.
        deletes: key columns of the rows to delete.
    """

    upserts: pa.Table
    deletes: pa.Table

    @property
    def touched(self) -> pa.Table:
        """Every key this epoch touches."""
        keys = self.deletes.column_names
        return pa.concat_tables([self.upserts.select(keys), self.deletes])


def _first_misfit(column: pa.ChunkedArray, target: pa.DataType) -> tuple[int, Any] | None:
    """The first value of ``column`` that does not convert to ``target`` exactly, and its row.

    Only called once a cast of the whole column failed, to name the value.
    """
    row = 0
    for chunk in column.chunks:
        for scalar in chunk:
            try:
                pa.array([scalar.as_py()], chunk.type).cast(target, safe=True)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, ValueError):
                return row, scalar.as_py()
            row += 1
    return None


def _conform(
    data: pa.Table,
    schema: pa.Schema,
    *,
    table: str,
    what: str,
    types: pa.Schema | None = None,
) -> pa.Table:
    """Select and cast ``data`` to ``schema``, naming the column and value that do not fit.

    ``types`` (the sink's column types) only adds the sink's own type to the
    errors, beside the store's.
    """
    columns = []
    for field in schema:
        if field.name not in data.column_names:
            raise RowsRejectedError(
                f"table {table!r}: {what} lack column {field.name!r} ({field.type}); "
                "nothing was written",
                table=table,
                column=field.name,
            )
        column = data.column(field.name)
        if pa.types.is_decimal(field.type) and not column.type.equals(field.type):
            # The one rule the Postgres sink also applies (reconcile.core.decimals):
            # a value is stored only if it fits the declared type exactly, never
            # rounded, so the sink and the expected state can never disagree.
            try:
                column = check_decimal_array(column, field.type.precision, field.type.scale)
            except DecimalFitError as exc:
                raise RowsRejectedError(
                    f"table {table!r}: column {field.name!r} value {exc.value!r} "
                    f"(row {exc.index}) does not fit the expected state's "
                    f"{type_names(field.type, types, field.name)} exactly: {exc.reason}; it "
                    "is refused rather than rounded; nothing was written",
                    table=table,
                    column=field.name,
                    value=repr(exc.value),
                    expected=str(field.type),
                    sink_type=sql_type(types, field.name),
                ) from None
            except TypeError:
                pass  # not numbers: the cast below names the column
        if not column.type.equals(field.type):
            try:
                column = column.cast(field.type, safe=True)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
                misfit = _first_misfit(column, field.type)
                shown = "" if misfit is None else f" value {misfit[1]!r:.200} (row {misfit[0]})"
                raise RowsRejectedError(
                    f"table {table!r}: column {field.name!r}{shown} of the {what}: type "
                    f"{column.type} does not convert to the expected state's "
                    f"{type_names(field.type, types, field.name)} ({exc}); nothing was written",
                    table=table,
                    column=field.name,
                    value=None if misfit is None else repr(misfit[1])[:200],
                    expected=str(field.type),
                    actual=str(column.type),
                    sink_type=sql_type(types, field.name),
                ) from exc
        columns.append(column)
    extra = [c for c in data.column_names if c not in schema.names and c not in (OP_COLUMN, "_seq")]
    if extra:
        raise RowsRejectedError(
            f"table {table!r}: {what} have column {extra[0]!r}, which the table does not have "
            f"(columns: {schema.names}); nothing was written",
            table=table,
            column=extra[0],
        )
    return pa.table(columns, schema=schema)


def _from_change_objects(changes: Iterable[Change], keys: Sequence[str], known: pa.Schema | None,
                         table: str, types: pa.Schema | None) -> pa.Table:  # fmt: skip
    """Arrow rows with ``_op`` from Change objects (small epochs; a Python loop is fine).

    ``known``: the table's types (or the sink's), for values Arrow cannot infer.
    Values of a column with a form (``types``) are put in it first: a ``uuid.UUID``
    becomes its text, a dict its JSON text.
    """
    forms = forms_of(types, known)
    rows: list[dict[str, Any]] = []
    for change in changes:
        if not isinstance(change, Change):
            raise InvalidInputError(
                f"apply() takes Change objects or an Arrow table, got {type(change).__name__}; "
                "nothing was written"
            )
        row = dict(change.row)
        if change.op == "delete":
            row = {k: row.get(k) for k in keys}
        row[OP_COLUMN] = change.op
        rows.append(row)
    # Every column any row names, in first-seen order: from_pylist alone would
    # take the columns of the first row only (a delete's keys, say).
    names = list(dict.fromkeys(name for row in rows for name in row))
    values = {name: formed_values(name, [row.get(name) for row in rows], forms.get(name),
                                  types, table) for name in names}  # fmt: skip
    return pa.table({name: _column(name, values[name], known, table) for name in names})


def _column(name: str, values: list[Any], known: pa.Schema | None, table: str) -> pa.Array:
    """One column of Python values as Arrow: inferred, else in the type the table has.

    Inference first, then ``_conform``'s checked cast, as for Arrow input; the
    known type is the way out only for values Arrow cannot infer one type for
    (ints beside Decimals, say).
    """
    try:
        return pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:
        error = exc
    target = None
    if known is not None and known.get_field_index(name) >= 0:
        target = known.field(name).type
        try:
            if pa.types.is_decimal(target):
                # Floats beside Decimals: each value by the shared exact-fit rule.
                p, s = target.precision, target.scale
                return pa.array([None if v is None else check_decimal(v, p, s) for v in values],
                                target)  # fmt: skip
            return pa.array(values, target)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError, ValueError) as exc:
            error = exc  # a DecimalFitError (a ValueError) names the value and the reason
    if isinstance(error, DecimalFitError):
        bad = error.value
    else:
        bad = next((v for v in values if not _converts(v, target)), None)
    shown = "" if bad is None else f" value {bad!r:.200}"
    into = "" if target is None else f" (the table has {target})"
    raise RowsRejectedError(
        f"table {table!r}: column {name!r}{shown}: the values do not convert to one Arrow "
        f"type{into}: {error}; nothing was written",
        table=table,
        column=name,
        value=None if bad is None else repr(bad)[:200],
    )


def _converts(value: Any, target: pa.DataType | None) -> bool:
    try:
        pa.array([value], target)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        return False
    return True


def _sink_schema(types: pa.Schema | None, keys: Sequence[str], table: str) -> pa.Schema | None:
    """For a first epoch without upserts: every column the sink types, if it types the keys."""
    if types is None or any(types.get_field_index(k) < 0 for k in keys):
        return None
    return infer_user_schema(types, keys, types, table=table)


def normalize_changes(
    changes: Iterable[Change] | pa.Table,
    *,
    keys: Sequence[str],
    schema: pa.Schema | None,
    table: str,
    types: pa.Schema | None = None,
) -> tuple[EpochChanges, pa.Schema]:
    """Validate one epoch's changes and reduce them to one operation per key.

    Args:
        changes: Change objects, or an Arrow table with the user columns plus a
            string column ``_op`` of "upsert"/"delete" (value columns of delete
            rows are ignored and may be NULL).
        keys: the key columns.
        schema: the user schema (keys + values), or None to infer it from the
            upserts (``expected_state.column_types.infer_user_schema``).
        types: the sink's column types: the types a schema inferred here takes
            (an epoch without rows takes all of its columns), and the sink's
            type names that errors show beside the store's.
        table: how errors name the table.

    Returns:
        The net changes, and the user schema.

    Raises:
        InvalidInputError: a missing/extra/mistyped column, a NULL key, a bad
            ``_op``, or a reserved column name; nothing was written.
    """
    # Values are put into their column's form first (``value_forms``): a key
    # given as 'ABC…' and as 'abc…' is then one key, netted as one.
    if isinstance(changes, pa.Table):
        check_refused(changes.column_names, types, table)
        data = formed(changes, forms_of(types, schema), types, table)
    else:
        known = schema if schema is not None else types
        data = _from_change_objects(changes, keys, known, table, types)
        check_refused(data.column_names, types, table)
    empty = data.num_rows == 0 and data.num_columns == 0
    if empty and schema is None:
        schema = _sink_schema(types, keys, table)
    if empty and schema is not None:
        # An epoch without output (an empty list of changes): nothing to check.
        key_schema = pa.schema([schema.field(k) for k in keys])
        return EpochChanges(upserts=schema.empty_table(), deletes=key_schema.empty_table()), schema
    if data.num_rows == 0 and OP_COLUMN not in data.column_names:
        data = data.append_column(OP_COLUMN, pa.array([], pa.string()))
    if OP_COLUMN not in data.column_names:
        raise InvalidInputError(
            f"table {table!r}: the changes lack the {OP_COLUMN!r} column "
            "('upsert' or 'delete' per row); nothing was written",
            table=table,
            column=OP_COLUMN,
        )
    for reserved in RESERVED_COLUMNS:
        if reserved in data.column_names:
            raise InvalidInputError(
                f"table {table!r}: column {reserved!r} is reserved (the store computes it); "
                "nothing was written",
                table=table,
                column=reserved,
            )
    ops = data.column(OP_COLUMN)
    is_upsert = pc.equal(ops, "upsert")
    is_delete = pc.equal(ops, "delete")
    bad = pc.invert(pc.fill_null(pc.or_(is_upsert, is_delete), False))
    if pc.any(bad).as_py():
        value = pc.filter(ops, bad)[0].as_py()
        raise InvalidInputError(
            f"table {table!r}: column {OP_COLUMN!r} has {value!r}; use 'upsert' or 'delete'; "
            "nothing was written",
            table=table,
            column=OP_COLUMN,
            value=repr(value),
        )
    _check_keys(data, keys, table, ("changes", "change(s)"))
    if schema is None:
        upsert_rows = data.filter(is_upsert).drop_columns([OP_COLUMN])
        # An Arrow table carries its columns' types even without upserts (an
        # empty first epoch): take them, unless one is unknown (the null type)
        # and the sink does not say it either.
        typed = isinstance(changes, pa.Table) and not any(
            pa.types.is_null(f.type) and (types is None or types.get_field_index(f.name) < 0)
            for f in upsert_rows.schema
        )
        if upsert_rows.num_rows or typed:
            schema = infer_user_schema(upsert_rows.schema, keys, types, table=table)
        else:
            schema = _sink_schema(types, keys, table)
        if schema is None:
            raise InvalidInputError(
                f"table {table!r}: cannot infer the table's schema from an epoch without "
                "upserts (and without an Arrow schema); pass schema=; nothing was written",
                table=table,
            )
    key_schema = pa.schema([schema.field(k) for k in keys])
    net = last_per_key(data, keys)
    net_ops = net.column(OP_COLUMN)
    upsert_rows = net.filter(pc.equal(net_ops, "upsert"))
    if upsert_rows.num_rows == 0 and not isinstance(changes, pa.Table):
        upserts = schema.empty_table()  # delete-only Change objects carry no value columns
    else:
        upserts = _conform(upsert_rows, schema, table=table, what="upserts", types=types)
    delete_rows = net.filter(pc.equal(net_ops, "delete")).select(list(keys))
    deletes = _conform(delete_rows, key_schema, table=table, what="deletes", types=types)
    return EpochChanges(upserts=upserts, deletes=deletes), schema


def _check_keys(data: pa.Table, keys: Sequence[str], table: str, what: tuple[str, str]) -> None:
    """Refuse rows that lack a key column or hold a NULL key; ``what``: how to name them."""
    for key in keys:
        if key not in data.column_names:
            raise RowsRejectedError(
                f"table {table!r}: the {what[0]} lack key column {key!r}; nothing was written",
                table=table,
                column=key,
            )
        if data.column(key).null_count:
            raise RowsRejectedError(
                f"table {table!r}: key column {key!r} is NULL in "
                f"{data.column(key).null_count} {what[1]}; nothing was written",
                table=table,
                column=key,
            )


def conform_upserts(
    rows: pa.Table, *, keys: Sequence[str], schema: pa.Schema, table: str,
    types: pa.Schema | None = None,
) -> pa.Table:  # fmt: skip
    """Rows that are all upserts, converted to ``schema`` as an epoch's are (``normalize_changes``).

    For a whole new state (a rebuild), where every row is an upsert: no ``_op``
    to compare row by row. The caller checks that no key repeats.

    Raises:
        InvalidInputError: a key column missing or NULL, or a value that does not fit
            (naming the column and the value); nothing was written.
    """
    rows = formed(rows, forms_of(types, schema), types, table)
    _check_keys(rows, keys, table, ("rows", "row(s)"))
    return _conform(rows, schema, table=table, what="upserts", types=types)


def change_rows(
    net: EpochChanges,
    user: pa.Schema,
    schema: pa.Schema,
    keys: Sequence[str],
    epoch: int,
    row_hashes: pa.Array | pa.ChunkedArray | None = None,
) -> pa.Table:
    """One epoch's change file: upserts with their row hash, then one tombstone per delete.

    Args:
        net: the epoch's net changes.
        user: the user schema (keys + values), the order of the hash.
        schema: the stored schema (user columns, ``_row_hash``, ``_epoch``, ``_op``).
        keys: the key columns.
        epoch: the epoch.
        row_hashes: the canonical row hash of each upsert, in order, where it was
            computed already (by Spark, over the same values and types); None
            computes it here.

    Returns:
        The rows, in ``schema``; a tombstone holds the key and NULL everywhere else.
    """
    ups, dels = net.upserts.num_rows, net.deletes.num_rows
    upserts = pa.table(
        [
            *net.upserts.columns,
            row_hash_arrow(net.upserts, user.names) if row_hashes is None else row_hashes,
            pa.array(np.full(ups, epoch, dtype=np.int64)),
            pa.repeat(pa.scalar("upsert"), ups),
        ],
        schema=schema,
    )
    if not dels:
        return upserts
    columns = [
        net.deletes.column(f.name) if f.name in keys else pa.nulls(dels, f.type) for f in user
    ]
    tombstones = pa.table(
        [
            *columns,
            pa.nulls(dels, pa.int64()),
            pa.array(np.full(dels, epoch, dtype=np.int64)),
            pa.repeat(pa.scalar("delete"), dels),
        ],
        schema=schema,
    )
    return pa.concat_tables([upserts, tombstones])
