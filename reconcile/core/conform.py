"""Pulled rows in the expected state's types: the type check, the casts, and the row hash.

A sink column must hold the kind of value its expected-state column holds; a
column whose type no longer matches is an error that names it, found before
anything is pulled (never a silent mismatch). Pulled values are then cast to
the expected state's exact Arrow types (the row hash depends on them). A value
that does not convert (a number too large, a decimal with more places: a hand
edit) is not an error but drift: its row gets a hash that matches nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]

from reconcile.core.contract import InvalidInputError
from reconcile.core.hashing import row_hash_arrow

__all__ = [
    "UNCONVERTIBLE",
    "SinkColumn",
    "check_columns",
    "column_mismatch",
    "conform",
    "fits",
    "hash_pulled",
    "values_to_arrow",
    "wants_text",
]

# A pulled table may carry this boolean column: rows whose values a puller could
# not convert to the expected types (they then count as changed, never as equal).
UNCONVERTIBLE = "_unconvertible"

# XORed into the row hash of a row with a value that does not convert: it then
# differs from the expected row's hash (a collision would need this exact flip).
_UNCONVERTIBLE = np.int64(0x5BD1E9955BD1E995)


@dataclass(frozen=True)
class SinkColumn:
    """A sink table's column, as recovery sees it.

    Attributes:
        name: the column name.
        kind: int, numeric, float8, float4, bool, text, char (blank-padded
            text), jsonb (a json or jsonb column: jsonb's text of it),
            uuid, date, timestamp, timestamptz, bytes, json (any value: a
            schemaless sink's), or other.
        sql_type: the database's own spelling of its type, for messages.
    """

    name: str
    kind: str
    sql_type: str


def fits(kind: str, typ: pa.DataType) -> bool:
    """Whether a sink column of recovery ``kind`` can be read as the expected-state type ``typ``.

    The one rule verify checks a table by, and the write path checks a sink
    table by at start-up: a column this says no to is never written.
    """
    t = pa.types
    if t.is_dictionary(typ):
        typ = typ.value_type
    stringy = t.is_string(typ) or t.is_large_string(typ)
    fits: dict[str, bool] = {
        "int": t.is_integer(typ) and typ != pa.uint64(),
        "numeric": t.is_decimal(typ),
        "float8": t.is_float64(typ),
        "float4": t.is_float32(typ),
        "bool": t.is_boolean(typ),
        "text": stringy,
        # Text in a value form (reconcile.core.value_forms): char(n), json, jsonb.
        "char": stringy,
        "jsonb": stringy,
        "uuid": stringy or (t.is_fixed_size_binary(typ) and typ.byte_width == 16),
        "date": t.is_date(typ),
        "timestamp": t.is_timestamp(typ) and typ.tz is None,
        "timestamptz": t.is_timestamp(typ) and typ.tz is not None,
        "bytes": t.is_binary(typ) or t.is_large_binary(typ),
    }
    if kind == "json":
        # A schemaless sink (JSON lines): its values are converted to the
        # expected type as they are read, and one that does not convert is
        # drift of its row, not a schema mismatch of the table.
        return True
    return bool(fits.get(kind, False))


def column_mismatch(
    schema: pa.Schema, columns: dict[str, SinkColumn]
) -> tuple[pa.Field, SinkColumn | None] | None:
    """The first expected-state column the sink lacks (None) or cannot be read as; None if none."""
    for field in schema:
        found = columns.get(field.name)
        if found is None or not fits(found.kind, field.type):
            return field, found
    return None


def check_columns(
    table: str, schema: pa.Schema, columns: dict[str, SinkColumn], keys: Sequence[str]
) -> None:
    """Check that the sink table holds every expected-state column, each of a matching type.

    Args:
        table: the sink table, for messages.
        schema: the expected state's user schema (keys and values).
        columns: the sink table's columns by name.
        keys: the expected state's key columns.

    Raises:
        InvalidInputError: a column missing from the sink, or whose type does not
            match the expected state's; it names the table, the column and both
            types, and nothing was pulled or written.
    """
    mismatch = column_mismatch(schema, columns)
    if mismatch is not None:
        field, found = mismatch
        if found is None:
            raise InvalidInputError(
                f"table {table}: the expected state has column {field.name!r} ({field.type}), "
                f"which the sink table lacks (it has {sorted(columns)}); the schemas no longer "
                "match, nothing was pulled or written",
                table=table,
                column=field.name,
            )
        raise InvalidInputError(
            f"table {table}: column {field.name!r} is {found.sql_type} in the sink but "
            f"{field.type} in the expected state; the schemas no longer match, nothing "
            "was pulled or written",
            table=table,
            column=field.name,
            sink_type=found.sql_type,
            expected_type=str(field.type),
        )
    for key in keys:
        if key not in schema.names:
            raise InvalidInputError(
                f"table {table}: key column {key!r} is not in the expected state's schema",
                table=table,
                column=key,
            )


def wants_text(kind: str, typ: pa.DataType) -> bool:
    """Whether the sink column is best read as text to reach ``typ`` exactly.

    numeric is read as its text (an exact decimal); a uuid kept as a string in
    the expected state is read as its canonical (lowercase, hyphenated) text;
    json and jsonb as their text, which is their value form (``value_forms``).
    """
    return kind in ("numeric", "jsonb") or (
        kind == "uuid" and (pa.types.is_string(typ) or pa.types.is_large_string(typ))
    )


def _cast(column: pa.Array, typ: pa.DataType) -> tuple[pa.Array, npt.NDArray[np.bool_] | None]:
    """Cast exactly; values that do not convert become NULL and are flagged."""
    if column.type.equals(typ):
        return column, None
    try:
        return column.cast(typ, safe=True), None
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        pass
    # Rare (drift): convert value by value to find the ones that do not fit.
    values = []
    bad = np.zeros(len(column), dtype=bool)
    for i, value in enumerate(column):
        try:
            values.append(pa.array([value.as_py()], column.type).cast(typ, safe=True)[0].as_py())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, ValueError):
            values.append(None)
            bad[i] = True
    return pa.array(values, typ), bad


def conform(pulled: pa.Table, schema: pa.Schema) -> tuple[pa.Table, npt.NDArray[np.bool_] | None]:
    """Cast pulled rows to the expected state's types, column by column.

    Args:
        pulled: the sink's rows, with the expected state's column names.
        schema: the expected state's user schema.

    Returns:
        The rows in exactly ``schema``, and a mask of rows with a value that did
        not convert (None when every value converted).
    """
    arrays = []
    bad: npt.NDArray[np.bool_] | None = None
    if UNCONVERTIBLE in pulled.column_names:
        flags = pulled.column(UNCONVERTIBLE).to_numpy(zero_copy_only=False).astype(bool)
        bad = flags if flags.any() else None
    for field in schema:
        column = pulled.column(field.name).combine_chunks()
        if isinstance(column.type, pa.ExtensionType):
            column = column.storage
        cast, flagged = _cast(column, field.type)
        if flagged is not None:
            bad = flagged if bad is None else (bad | flagged)
        arrays.append(cast)
    return pa.Table.from_arrays(arrays, schema=schema), bad


def hash_pulled(
    rows: pa.Table, bad: npt.NDArray[np.bool_] | None, columns: Sequence[str]
) -> pa.Array:
    """The canonical row hash of conformed rows; flagged rows get one that matches nothing."""
    if rows.num_rows == 0:
        return pa.array([], pa.int64())
    hashes = row_hash_arrow(rows, columns)
    if bad is None or not bad.any():
        return hashes
    raw = hashes.to_numpy()
    return pa.array(np.where(bad, raw ^ _UNCONVERTIBLE, raw), pa.int64())


def values_to_arrow(columns: Sequence[list[Any]], schema: pa.Schema) -> pa.Table:
    """Python values (a list per column of ``schema``) in its types; a misfit is flagged.

    A column whose values all convert is built in one call; otherwise each
    value is tried alone, a misfit becomes NULL and its row is flagged in the
    ``UNCONVERTIBLE`` column, which ``conform`` reads (drift, never a lost row).
    """
    rows = len(columns[0]) if columns else 0
    arrays = []
    bad = np.zeros(rows, dtype=bool)
    for field, values in zip(schema, columns, strict=True):
        try:
            arrays.append(pa.array(values, field.type))
            continue
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
            pass
        kept = []
        for j, value in enumerate(values):
            try:
                pa.array([value], field.type)
                kept.append(value)
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
                kept.append(None)
                bad[j] = True
        arrays.append(pa.array(kept, field.type))
    table = pa.Table.from_arrays(arrays, schema=schema)
    return table.append_column(UNCONVERTIBLE, pa.array(bad))
