"""An epoch's staged changes as Arrow: in the table's types, checked.

The changes are netted by key first (``sinks.changes``). Every failure names
the table, the column and the value, and says that nothing was written.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]

from reconcile.core.contract import InvalidInputError
from reconcile.core.keys import check_arrow_keys

__all__ = ["EPOCH_COLUMN", "creation_schema", "to_arrow"]

EPOCH_COLUMN = "_epoch"


def to_arrow(rows: list[dict[str, Any]], schema: pa.Schema, where: str) -> pa.Table:
    """``rows`` in ``schema``'s types (a column the rows lack is NULL).

    Raises:
        InvalidInputError: a column the table lacks, or a value that does not
            fit its column (both named, with the value); nothing was written.
    """
    extra = sorted({name for row in rows for name in row} - set(schema.names))
    if extra:
        raise InvalidInputError(
            f"{where}: column {extra[0]!r} is not in the table (columns: {schema.names}); "
            "nothing was written",
            table=where,
            column=extra[0],
        )
    arrays = []
    for field in schema:
        values = [row.get(field.name) for row in rows]
        try:
            arrays.append(pa.array(values, field.type))
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as exc:
            bad = next((v for v in values if not _fits(v, field.type)), None)
            raise InvalidInputError(
                f"{where}: value {bad!r:.100} does not fit column {field.name!r} "
                f"({field.type}): {exc}; nothing was written",
                table=where,
                column=field.name,
            ) from None
        if not field.nullable and arrays[-1].null_count:
            raise InvalidInputError(
                f"{where}: column {field.name!r} is required, and a row holds NULL in it; "
                "nothing was written",
                table=where,
                column=field.name,
            )
    return pa.Table.from_arrays(arrays, schema=schema)


def _fits(value: Any, typ: pa.DataType) -> bool:
    try:
        pa.array([value], typ)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
        return False
    return True


def creation_schema(
    declared: pa.Schema | None, rows: list[dict[str, Any]], keys: Sequence[str], where: str
) -> pa.Schema | None:
    """The Arrow schema the sink creates its table with; None when nothing gives one yet.

    The declared schema, else the one the rows infer; ``_epoch`` is added, and
    the key columns are required (Iceberg's identifier fields must be).

    Raises:
        InvalidInputError: a key column the schema lacks, or a floating-point key.
    """
    if declared is not None:
        schema = declared
    elif rows:
        try:
            schema = pa.Table.from_pylist(rows).schema
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise InvalidInputError(
                f"{where}: the rows give no one type per column ({exc}); pass schema=; "
                "nothing was written",
                table=where,
            ) from None
    else:
        return None
    missing = [k for k in keys if k not in schema.names]
    if missing:
        raise InvalidInputError(
            f"{where}: key column {missing[0]!r} is not in the table's schema "
            f"({schema.names}); nothing was written",
            table=where,
            column=missing[0],
        )
    check_arrow_keys(where, schema, keys)
    fields = [f.with_nullable(f.name not in keys) for f in schema if f.name != EPOCH_COLUMN]
    return pa.schema([*fields, pa.field(EPOCH_COLUMN, pa.int64())])


def arrow_upserts(
    tables: Sequence[pa.Table], schema: pa.Schema, keys: Sequence[str], where: str
) -> pa.Table | None:
    """Arrow tables of upserts in ``schema``'s types, without a trip through Python rows.

    Returns None when a key repeats (the last change must win: the caller
    nets row by row), so the result holds each key once.

    Raises:
        InvalidInputError: a column the table lacks, a missing or NULL key, or
            a column that does not cast to the table's type (named); nothing
            was written.
    """
    data = pa.concat_tables(tables, promote_options="permissive") if len(tables) > 1 else tables[0]
    extra = [name for name in data.column_names if name not in schema.names]
    if extra:
        raise InvalidInputError(
            f"{where}: column {extra[0]!r} is not in the table (columns: {schema.names}); "
            "nothing was written",
            table=where,
            column=extra[0],
        )
    for key in keys:
        if key not in data.column_names or data.column(key).null_count:
            raise InvalidInputError(
                f"{where}: a row has no value in key column {key!r}; nothing was written",
                table=where,
                column=key,
            )
    if data.group_by(list(keys)).aggregate([]).num_rows != data.num_rows:
        return None
    columns = []
    for field in schema:
        if field.name not in data.column_names:
            columns.append(pa.nulls(data.num_rows, field.type))
            continue
        try:
            columns.append(data.column(field.name).cast(field.type))
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
            raise InvalidInputError(
                f"{where}: column {field.name!r} ({data.schema.field(field.name).type}) does not "
                f"fit the table's {field.type}: {exc}; nothing was written",
                table=where,
                column=field.name,
            ) from None
    return pa.Table.from_arrays(columns, schema=schema)
