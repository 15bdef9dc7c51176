"""Where a store table's column types come from: a sink's table, the values, or the user.

A store table's types are fixed once it exists (Delta requires it, and the row
hash depends on them: ``docs/hashing.md``), so they must be wide enough for
every value a later epoch may bring. In order of precedence:

1. a schema given explicitly (``schemas=`` / ``schema=``) is taken as it is by a
   new table; for an existing one it is the target of a schema change, which
   the commit cycle evolves in place or refuses (``reconcile.core.schema_change``);
2. an existing table keeps its schema;
3. a sink with a table says its columns' types (``arrow_schema()``: the
   Postgres and SQL sinks reflect their target, the Delta sink its table):
   each column of the first recorded epoch takes the type of the sink's
   column of the same name, e.g. ``numeric(12,2)`` becomes ``decimal128(12,2)``
   whatever the digits of the first values;
4. otherwise (a sink without a table, or a column the sink has no Arrow type
   for) the type is inferred from the first epoch's values, widened so that
   later values can grow: a decimal keeps its scale and gets 38 digits of
   precision (``Decimal("123.45")`` is stored as ``decimal128(38,2)``, not
   ``decimal128(5,2)``). A column that is NULL in every upsert of the first
   epoch has no type to infer and is refused (give ``schemas=``), as is a
   type the row hash cannot take (nested values, times, intervals).

A sink's schema carries each column's own type name as the field metadata
``sql_type`` (e.g. ``numeric(12,2)``), so that errors can name both types.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]

from reconcile.core.contract import ConfigurationError, InvalidInputError
from reconcile.core.hashing import hash_kind

__all__ = [
    "SQL_TYPE",
    "check_column_names",
    "check_store_types",
    "holds",
    "infer_user_schema",
    "sql_type",
    "type_names",
    "widen_inferred",
]

# Field metadata key: the sink's own spelling of a column's type.
SQL_TYPE = b"sql_type"

# Decimal digits of the largest value of each integer width (signed; unsigned one more).
_INT_DIGITS = {8: 3, 16: 5, 32: 10, 64: 19}
_UINT_DIGITS = {8: 3, 16: 5, 32: 10, 64: 20}
# decimal128's precision: the widest decimal the row hash takes.
_MAX_PRECISION = 38


def check_column_names(names: Sequence[str], *, table: str) -> None:
    """Refuse column names that a Delta table cannot hold side by side.

    Delta compares column names without case, so ``note`` and ``Note`` are
    one column to it: the store's commit would fail at every attempt, at the
    commit point, with a message that names no table. Refused here, before
    anything is written, as a configuration no retry can fix.

    Raises:
        ConfigurationError: naming the table and both columns.
    """
    seen: dict[str, str] = {}
    for name in names:
        other = seen.setdefault(name.casefold(), name)
        if other != name:
            raise ConfigurationError(
                f"table {table!r}: columns {other!r} and {name!r} differ only in case, and "
                "the expected-state store (a Delta table) takes column names without case, "
                "so it cannot hold both; rename one of them. Nothing was written",
                table=table,
                column=name,
            )


def sql_type(types: pa.Schema | None, name: str) -> str | None:
    """The sink's own type name of column ``name`` (``numeric(12,2)``), if it said one."""
    if types is None or types.get_field_index(name) < 0:
        return None
    metadata = types.field(name).metadata or {}
    found = metadata.get(SQL_TYPE)
    return None if found is None else found.decode()


def type_names(store: pa.DataType, types: pa.Schema | None, name: str) -> str:
    """Both types of a column as an error names them: the store's, then the sink's."""
    sink = sql_type(types, name)
    return f"{store}" + (f" (the sink column is {sink})" if sink else "")


def widen_inferred(dtype: pa.DataType) -> pa.DataType:
    """An inferred type, widened so that later values of the same kind still fit.

    A decimal inferred from values gets the largest precision (38) with the
    same scale: the digits of the first values say nothing about later ones.
    Other inferred types already hold their whole kind (Python ints are int64,
    floats float64, strings string).
    """
    if pa.types.is_dictionary(dtype):
        dtype = dtype.value_type
    if pa.types.is_decimal128(dtype) and 0 <= dtype.scale <= _MAX_PRECISION:
        return pa.decimal128(_MAX_PRECISION, dtype.scale)
    return dtype


def infer_user_schema(
    data: pa.Schema,
    keys: Sequence[str],
    types: pa.Schema | None,
    *,
    table: str,
) -> pa.Schema:
    """The user schema of a new store table: the columns of ``data``, keys first.

    Args:
        data: the first epoch's columns (their types as inferred from the values).
        keys: the key columns.
        types: the sink's column types (see the module's docstring), or None.
        table: how errors name the table.

    Returns:
        A schema of ``data``'s columns, each of the sink's type where the sink
        has the column, else of the widened inferred type; no field metadata.

    Raises:
        InvalidInputError: a key column missing, a column whose type cannot be
            inferred (NULL in every upsert) or that the row hash cannot take;
            nothing was written.
    """
    check_column_names(data.names, table=table)
    missing = [k for k in keys if data.get_field_index(k) < 0]
    if missing:
        raise InvalidInputError(
            f"table {table!r}: the rows lack key column {missing[0]!r}; nothing was written",
            table=table,
            column=missing[0],
        )
    fields = []
    for name in [*keys, *(n for n in data.names if n not in keys)]:
        if types is not None and types.get_field_index(name) >= 0:
            dtype = types.field(name).type
        else:
            dtype = widen_inferred(data.field(name).type)
            if pa.types.is_null(dtype):
                raise InvalidInputError(
                    f"table {table!r}: column {name!r} is NULL in every upsert of the first "
                    "epoch, so its type cannot be inferred; give the store's schema "
                    "(ExpectedState(..., schemas={sink: pyarrow.schema([...])})); nothing was "
                    "written",
                    table=table,
                    column=name,
                )
        hash_kind(name, dtype)  # refuse a type the row hash cannot take, naming it
        fields.append(pa.field(name, dtype))
    return pa.schema(fields)


def holds(store: pa.DataType, sink: pa.DataType) -> bool:
    """Whether every value of Arrow type ``sink`` is a value of Arrow type ``store``.

    Decimals compare digits before and after the point; integers their width
    (a decimal holds an integer type if it has its digits); floats their width.
    Strings hold strings, binaries binaries. Timestamps hold timestamps of the
    same kind (with a time zone or without): their units are not compared, since
    the sinks' timestamps are all microseconds and a value a unit cannot hold
    (beyond the year 2262 in nanoseconds) is refused when it comes.
    """
    t = pa.types
    if t.is_dictionary(store):
        store = store.value_type
    if t.is_dictionary(sink):
        sink = sink.value_type
    if store.equals(sink):
        return True
    if t.is_decimal(store):
        digits = store.precision - store.scale
        if t.is_decimal(sink):
            return bool(store.scale >= sink.scale and digits >= sink.precision - sink.scale)
        if t.is_integer(sink):
            table = _INT_DIGITS if t.is_signed_integer(sink) else _UINT_DIGITS
            return bool(digits >= table[sink.bit_width])
        return False
    if t.is_integer(store):
        if not t.is_integer(sink):
            return False
        if t.is_signed_integer(store):
            # A signed type holds an unsigned one only if it is wider.
            wider = store.bit_width > sink.bit_width or t.is_signed_integer(sink)
            return bool(store.bit_width >= sink.bit_width and wider)
        return bool(t.is_unsigned_integer(sink) and store.bit_width >= sink.bit_width)
    if t.is_floating(store):
        return bool(t.is_floating(sink) and store.bit_width >= sink.bit_width)
    if t.is_timestamp(store):
        return bool(t.is_timestamp(sink) and (store.tz is None) == (sink.tz is None))
    for kind in (_stringy, _binary, t.is_date, t.is_boolean):
        if kind(store):
            return bool(kind(sink))
    return False


def _stringy(dtype: pa.DataType) -> bool:
    t = pa.types
    return bool(t.is_string(dtype) or t.is_large_string(dtype) or t.is_string_view(dtype))


def _binary(dtype: pa.DataType) -> bool:
    t = pa.types
    return bool(t.is_binary(dtype) or t.is_large_binary(dtype) or t.is_binary_view(dtype))


def check_store_types(store: pa.Schema, types: pa.Schema, *, table: str, sink: str) -> None:
    """Refuse a store table whose column cannot hold every value of the sink's column.

    Args:
        store: the store table's user schema.
        types: the sink's column types.
        table: the store table, for the message.
        sink: the sink's name.

    Raises:
        ConfigurationError: naming every such column with both types. A column
            the sink does not type (or does not have) is not compared here.
    """
    narrow = [
        f.name
        for f in store
        if types.get_field_index(f.name) >= 0 and not holds(f.type, types.field(f.name).type)
    ]
    if not narrow:
        return
    described = "; ".join(
        f"column {name!r} is {store.field(name).type} in the store but "
        f"{sql_type(types, name) or types.field(name).type} in the sink"
        for name in narrow
    )
    raise ConfigurationError(
        f"sink {sink!r}: the expected state (table {table!r}) cannot hold every value the sink "
        f"table can: {described}. An epoch with such a value would be refused. A store table "
        "keeps its types (the row hash depends on them): narrow the sink column to the "
        "store's type, or start the pipeline afresh (a new store root, an empty sink table); "
        "nothing was written",
        sink=sink,
        table=table,
        column=narrow[0],
        store_type=str(store.field(narrow[0]).type),
        sink_type=sql_type(types, narrow[0]) or str(types.field(narrow[0]).type),
    )
