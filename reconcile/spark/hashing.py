"""The canonical row hash as a native Spark expression: ``xxhash64`` plus the null mask."""

from __future__ import annotations

from collections.abc import Sequence
from functools import reduce
from typing import Any

from reconcile.core.contract import InvalidInputError

__all__ = ["quote_column", "row_hash_column", "row_hash_sql"]

# Spark types the canonical hash supports (see reconcile.core.hashing for the encoding).
_SUPPORTED = (
    "NullType",
    "BooleanType",
    "ByteType",
    "ShortType",
    "IntegerType",
    "LongType",
    "FloatType",
    "DoubleType",
    "DecimalType",
    "DateType",
    "TimestampType",
    "TimestampNTZType",
    "StringType",
    "BinaryType",
)


def quote_column(name: str) -> str:
    """Quote a column name for Spark SQL (backticks, with inner backticks doubled)."""
    return "`" + name.replace("`", "``") + "`"


def _check_types(columns: Sequence[str], schema: Any) -> None:
    fields = {f.name: f.dataType for f in schema.fields}
    for name in columns:
        if name not in fields:
            raise InvalidInputError(
                f"row_hash_column(): column {name!r} is not in the schema {list(fields)}",
                column=name,
            )
        dtype = fields[name]
        kind = type(dtype).__name__
        if kind not in _SUPPORTED:
            raise InvalidInputError(
                f"column {name!r} has type {dtype.simpleString()} which the row hash does "
                "not support",
                column=name,
                type=dtype.simpleString(),
            )
        if kind == "StringType" and not dtype.isUTF8BinaryCollation():
            # Spark hashes a collated string by its collation key, not its bytes.
            raise InvalidInputError(
                f"column {name!r} is a string with collation {dtype.collation}; the row hash "
                "needs UTF8_BINARY",
                column=name,
                type=dtype.simpleString(),
            )


def row_hash_sql(columns: Sequence[str]) -> str:
    """The canonical row hash as a Spark SQL expression over the named columns.

    Args:
        columns: the columns to hash, in hash order.

    Returns:
        ``xxhash64(`c0`, ..., `cn`, <mask words>)``, usable in ``selectExpr`` or SQL.
        It does not check types; :func:`row_hash_column` does.
    """
    if not columns:
        raise InvalidInputError("row_hash_sql() needs at least one column to hash")
    words = []
    for start in range(0, len(columns), 64):
        bits = []
        for b, name in enumerate(columns[start : start + 64]):
            bit = -(1 << 63) if b == 63 else 1 << b
            bits.append(
                f"IF({quote_column(name)} IS NULL, CAST({bit} AS BIGINT), CAST(0 AS BIGINT))"
            )
        words.append("(" + " | ".join(bits) + ")")
    return "xxhash64(" + ", ".join([*map(quote_column, columns), *words]) + ")"


def row_hash_column(columns: Sequence[str], schema: Any) -> Any:
    """The canonical row hash as a native Spark Column (no Python UDF).

    Executors evaluate it in the JVM with Spark's built-in ``xxhash64``; it equals
    :func:`reconcile.core.hashing.row_hash_arrow` for the same rows and types.

    Args:
        columns: the columns to hash, in hash order.
        schema: the DataFrame's ``StructType`` (``df.schema``), used to check types.

    Returns:
        A ``pyspark.sql.Column`` of LongType, never NULL.

    Raises:
        InvalidInputError: no columns, an unknown column, or an unsupported type.
    """
    from pyspark.sql import functions as F

    if not columns:
        raise InvalidInputError("row_hash_column() needs at least one column to hash")
    _check_types(columns, schema)
    cols = [F.col(quote_column(c)) for c in columns]
    words = []
    for start in range(0, len(columns), 64):
        bits = [
            F.when(col.isNull(), F.lit(-(1 << 63) if b == 63 else 1 << b).cast("long")).otherwise(
                F.lit(0).cast("long")
            )
            for b, col in enumerate(cols[start : start + 64])
        ]
        words.append(reduce(lambda a, b: a.bitwiseOR(b), bits))
    return F.xxhash64(*cols, *words)
