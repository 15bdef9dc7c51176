"""The canonical row hash of one row, with the ``xxhash`` package: the reference implementation.

It computes exactly what :func:`reconcile.core.hashing.row_hash_arrow` computes
vectorized (the definition is in that module's docstring); the tests check the
two against each other and against Spark.
"""

from __future__ import annotations

import datetime as dt
import math
import struct
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]
import xxhash

from reconcile.core.contract import InvalidInputError
from reconcile.core.hashing import (
    DECIMAL_CONTEXT,
    DOUBLE_NAN_BITS,
    EPOCH_DATE,
    EPOCH_NAIVE,
    EPOCH_UTC,
    FLOAT_NAN_BITS,
    HASH_SEED,
    MASK64,
    ONE_US,
    US_PER_UNIT,
    hash_kind,
    null_mask_words,
)

__all__ = ["row_hash"]


def _scalar_bytes(name: str, value: Any, dtype: pa.DataType, kind: str) -> bytes:
    """The bytes XXH64 hashes for one non-NULL value."""
    if kind == "bool":
        return struct.pack("<i", 1 if value else 0)
    if kind == "int":
        return struct.pack("<I", int(value) & 0xFFFFFFFF)
    if kind == "date":
        days = (value - EPOCH_DATE).days if isinstance(value, dt.date) else int(value)
        return struct.pack("<I", days & 0xFFFFFFFF)
    if kind == "long":
        return struct.pack("<Q", int(value) & MASK64)
    if kind == "timestamp":
        if isinstance(value, dt.datetime):
            epoch = EPOCH_NAIVE if value.tzinfo is None else EPOCH_UTC
            micros = (value - epoch) // ONE_US
        else:
            unit = dtype.unit
            micros = int(value) // 1000 if unit == "ns" else int(value) * US_PER_UNIT[unit]
        return struct.pack("<Q", micros & MASK64)
    if kind == "double":
        d = float(value)
        if math.isnan(d):
            return struct.pack("<Q", DOUBLE_NAN_BITS)
        return struct.pack("<d", 0.0 if d == 0.0 else d)
    if kind == "float":
        f = struct.unpack("<f", struct.pack("<f", float(value)))[0]
        if math.isnan(f):
            return struct.pack("<I", FLOAT_NAN_BITS)
        return struct.pack("<f", 0.0 if f == 0.0 else f)
    if kind in ("decimal_long", "decimal_bytes"):
        scaled = Decimal(value).scaleb(dtype.scale, context=DECIMAL_CONTEXT)
        if scaled != scaled.to_integral_value():
            raise InvalidInputError(
                f"column {name!r}: {value!r} has more than {dtype.scale} decimal places",
                column=name,
                value=repr(value),
            )
        unscaled = int(scaled)
        if kind == "decimal_long":
            return struct.pack("<Q", unscaled & MASK64)
        size = (unscaled + (unscaled < 0)).bit_length() // 8 + 1
        return unscaled.to_bytes(size, "big", signed=True)
    if isinstance(value, str):
        return value.encode("utf-8")
    return bytes(value)


def row_hash(
    row: Mapping[str, Any], schema: pa.Schema, columns: Sequence[str] | None = None
) -> int:
    """Compute the canonical row hash of one row (``None`` is NULL).

    Args:
        row: column name to Python value (int, float, Decimal, str, bytes, bool,
            date, datetime; or the raw integer of a date or timestamp).
        schema: the Arrow schema that gives each column's type.
        columns: the columns to hash, in hash order; default: the schema's order.

    Returns:
        The hash as a signed 64-bit int, equal to :func:`row_hash_arrow`'s.

    Raises:
        InvalidInputError: no columns, a column missing from the row or the
            schema, an unsupported type, or a decimal with too many places.
    """
    names = list(schema.names if columns is None else columns)
    if not names:
        raise InvalidInputError("row_hash() needs at least one column to hash")
    seed = HASH_SEED
    nulls: list[bool] = []
    for name in names:
        if name not in row or name not in schema.names:
            raise InvalidInputError(
                f"row_hash(): column {name!r} is missing from the row or the schema",
                column=name,
            )
        dtype = schema.field(name).type
        kind = hash_kind(name, dtype)
        value = row[name]
        is_null = value is None or kind == "null"
        nulls.append(is_null)
        if not is_null:
            seed = xxhash.xxh64_intdigest(_scalar_bytes(name, value, dtype, kind), seed=seed)
    for word in null_mask_words(nulls):
        seed = xxhash.xxh64_intdigest(struct.pack("<Q", word & MASK64), seed=seed)
    return seed - (1 << 64) if seed >= 1 << 63 else seed
