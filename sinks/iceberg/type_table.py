"""Iceberg column types as the sink holds them: one registry, read by the code and the docs.

``ICEBERG_TYPES`` has one entry per Iceberg type (pyiceberg's type classes):
its pull-and-diff kind (``recovery.sink_kind`` reads it), and its row of
``docs/types.md`` (``sinks.types_doc`` renders it). The store holds a column
as the table's own Arrow type (``Schema.as_arrow()``). A type the registry
refuses, or does not know, has no type the row hash takes: the sink's
``arrow_schema()`` names such a column as refused, and the store refuses a row
that gives it, naming the table, the column and the type, before anything is
written.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FixedType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    StringType,
    StructType,
    TimestampType,
    TimestamptzType,
    TimeType,
    UUIDType,
)

from reconcile.core.type_table import ColumnType

__all__ = ["ICEBERG_TYPES", "IcebergColumnType", "iceberg_kind", "iceberg_refusal"]

_ROWS = "Python values of the column's Arrow type"
_ARROW = "any type that casts to the column's exactly"
_WRITTEN = "Parquet, in the table's type"


@dataclass(frozen=True)
class IcebergColumnType:
    """How the Iceberg sink holds one Iceberg type.

    Attributes:
        classes: the pyiceberg type classes it covers.
        doc: its row of the type table.
        kind: its pull-and-diff kind (``reconcile.core.conform.SinkColumn``); "" when refused.
    """

    classes: tuple[type[IcebergType], ...]
    doc: ColumnType
    kind: str = ""


# fmt: off
ICEBERG_TYPES: tuple[IcebergColumnType, ...] = (
    IcebergColumnType((BooleanType,), ColumnType(
        "boolean", "bool", "bool", _ARROW, _WRITTEN, "bool"), "bool"),
    IcebergColumnType((IntegerType,), ColumnType(
        "int", "int32", "int in the int32 range (a declared int8, int16 or uint16 is an int)",
        _ARROW, _WRITTEN, "the integer"), "int"),
    IcebergColumnType((LongType,), ColumnType(
        "long", "int64", "int in the int64 range", _ARROW, _WRITTEN, "the integer"), "int"),
    IcebergColumnType((FloatType,), ColumnType(
        "float", "float32 (float)", "float, int; NaN, ±inf, -0.0 too", _ARROW, _WRITTEN,
        "float32: -0.0 as 0.0, every NaN as one"), "float4"),
    IcebergColumnType((DoubleType,), ColumnType(
        "double", "float64 (double)", "float, int; NaN, ±inf, -0.0 too", _ARROW, _WRITTEN,
        "float64: -0.0 as 0.0, every NaN as one"), "float8"),
    IcebergColumnType((DecimalType,), ColumnType(
        "decimal(p, s)", "decimal128(p, s)",
        "Decimal, int: only if it fits exactly (never rounded)", _ARROW, _WRITTEN,
        "the decimal (its unscaled integer)"), "numeric"),
    IcebergColumnType((StringType,), ColumnType(
        "string", "large_string", "str", _ARROW, _WRITTEN, "the UTF-8 text"), "text"),
    IcebergColumnType((BinaryType,), ColumnType(
        "binary", "large_binary", "bytes", _ARROW, _WRITTEN, "the bytes"), "bytes"),
    IcebergColumnType((FixedType,), ColumnType(
        "fixed(n)", "fixed_size_binary[n]", "bytes of exactly n", _ARROW, _WRITTEN,
        "the bytes"), "bytes"),
    IcebergColumnType((DateType,), ColumnType(
        "date", "date32", "datetime.date (not datetime)", _ARROW, _WRITTEN,
        "days since 1970-01-01"), "date"),
    IcebergColumnType((TimestampType,), ColumnType(
        "timestamp", "timestamp[us]", "naive datetime.datetime (a declared timestamp[ms] is "
        "one in microseconds)", _ARROW, _WRITTEN, "microseconds, wall clock"), "timestamp"),
    IcebergColumnType((TimestamptzType,), ColumnType(
        "timestamptz", "timestamp[us, tz=UTC]", "aware datetime.datetime (any zone)", _ARROW,
        _WRITTEN, "microseconds since the epoch, UTC"), "timestamptz"),
    IcebergColumnType((UUIDType,), ColumnType(
        "uuid", refused="its Arrow type (the uuid extension) is not one the row hash takes: "
        "declare it as a string")),
    IcebergColumnType((TimeType,), ColumnType(
        "time", refused="the row hash takes no time of day (store it as a string or as "
        "microseconds)")),
    IcebergColumnType((StructType, ListType, MapType), ColumnType(
        "struct, list, map", refused="the row hash takes no nested value (store it as JSON "
        "text)")),
    IcebergColumnType((), ColumnType(
        "timestamp_ns, timestamptz_ns, unknown, variant, geometry and every other type",
        refused="no type the row hash takes")),
)
# fmt: on


def _entry(typ: IcebergType) -> IcebergColumnType | None:
    return next((e for e in ICEBERG_TYPES if isinstance(typ, e.classes)), None)


def iceberg_kind(typ: IcebergType) -> str:
    """The pull-and-diff kind of an Iceberg column type: ``other`` if it is not held."""
    entry = _entry(typ)
    return "other" if entry is None or not entry.kind else entry.kind


def iceberg_refusal(typ: IcebergType) -> str | None:
    """Why the engine cannot hold a column of type ``typ`` exactly; None if it can."""
    entry = _entry(typ)
    if entry is not None and entry.kind:
        return None
    why = entry.doc.refused if entry is not None else "no type the row hash takes"
    return f"{typ} ({why})"
