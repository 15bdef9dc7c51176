"""The target table's columns as Arrow types: what the expected-state store records them as.

Each column a writer gives maps to the Arrow type that holds every value the
column holds, exactly, and that the row hash takes (``docs/hashing.md``):

===============================  ==========================================
PostgreSQL                       Arrow
===============================  ==========================================
smallint, integer, bigint        int16, int32, int64
numeric(p, s), p <= 38, 0<=s<=p  decimal128(p, s)
numeric (no precision)           decimal128(38, 18), see below
real, double precision           float32, float64
boolean                          bool
text, varchar(n), char(n), name  string
uuid                             string (its canonical text)
date                             date32
timestamp                        timestamp[us]
timestamptz                      timestamp[us, tz=UTC]
bytea                            binary
===============================  ==========================================

A ``numeric`` without precision holds any number of digits, which no Arrow
decimal does; it is recorded as ``decimal128(38, 18)`` (20 digits before the
point, 18 after: Spark's choice for an unbounded decimal), and a value beyond
it is refused when the epoch is staged, naming both types. A ``numeric(p, s)``
wider than 38 digits, or with a scale outside 0..p, has no type the row hash
takes, and json/jsonb, time, interval, arrays, enums and other types have none
either (the hash takes no nested values, and the server rewrites a jsonb's
text): such columns are left out, so the store infers their type from the
values, and refuses those it cannot hash. ``_epoch`` (written by the sink) and
columns the database writes itself (GENERATED ALWAYS) are left out too.
"""

from __future__ import annotations

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]

from reconcile.core.decimals import arrow_decimal_type

from .schema import EPOCH_COLUMN, Column, TableSchema

__all__ = ["UNBOUNDED_NUMERIC", "arrow_type", "target_arrow_schema"]

# The store's type for a numeric column declared without precision.
UNBOUNDED_NUMERIC = pa.decimal128(38, 18)

_FIXED = {
    "int2": pa.int16(),
    "int4": pa.int32(),
    "int8": pa.int64(),
    "float4": pa.float32(),
    "float8": pa.float64(),
    "bool": pa.bool_(),
    "text": pa.string(),
    "varchar": pa.string(),
    "bpchar": pa.string(),
    "name": pa.string(),
    "citext": pa.string(),
    "uuid": pa.string(),
    "date": pa.date32(),
    "timestamp": pa.timestamp("us"),
    "timestamptz": pa.timestamp("us", tz="UTC"),
    "bytea": pa.binary(),
}


def arrow_type(column: Column) -> pa.DataType | None:
    """The Arrow type that holds every value of ``column`` exactly; None if there is none."""
    if column.typname == "numeric":
        precision, scale = column.numeric_bounds
        if precision is None:
            return UNBOUNDED_NUMERIC
        decimal = arrow_decimal_type(precision, scale or 0)
        return decimal if decimal is not None and precision <= 38 else None
    return _FIXED.get(column.typname)


def target_arrow_schema(table: TableSchema) -> pa.Schema:
    """The columns a writer gives, as Arrow types, each with its SQL type as ``sql_type``."""
    fields = []
    for name, column in table.columns.items():
        if name == EPOCH_COLUMN or column.written_by_database is not None:
            continue
        dtype = arrow_type(column)
        if dtype is not None:
            fields.append(pa.field(name, dtype, metadata={"sql_type": column.sql_type}))
    return pa.schema(fields)
