"""The canonical row hash: Spark-compatible xxhash64 of a row's values plus a null mask.

Definition (the one place it is defined; ``docs/hashing.md`` walks through a vector)
---------------------------------------------------------------------------------------

For the columns ``c_0 .. c_{n-1}`` of a row, in the given order (schema order by
default), with ``n >= 1``::

    row_hash = xxhash64(c_0, ..., c_{n-1}, m_0, ..., m_{k-1})      -- Spark SQL semantics

where ``xxhash64`` is Spark's built-in function (``pyspark.sql.functions.xxhash64``)
and ``m_j`` are ``k = ceil(n / 64)`` BIGINT *null-mask words*: bit ``b`` (value
``1 << b``, two's complement, so bit 63 is the sign bit) of ``m_j`` is set iff
column ``c_{64*j + b}`` is NULL. The mask words are never NULL.

Spark's ``xxhash64`` is XXH64 (the standard algorithm, as in the ``xxhash``
package) chained over the arguments: the running hash starts at the seed 42, and
each non-NULL argument is hashed with the running hash as its seed, the result
becoming the new running hash. A NULL argument is skipped, which is why the mask
is appended: without it, a NULL moved from one column to another would not
change the hash. The result is a signed 64-bit integer (Spark ``LongType``).

How each value is turned into bytes before XXH64 (Spark's ``HashExpression``):

=============================================  ============================================
Arrow type (Spark type)                         bytes hashed
=============================================  ============================================
bool (BooleanType)                              int32 1 or 0, 4 bytes little-endian
int8, int16, int32 (Byte/Short/IntegerType),    the value as int32, 4 bytes LE
uint8, uint16 (Spark reads them as Short/Int)
date32, date64 (DateType)                       days since 1970-01-01 as int32, 4 bytes LE
int64 (LongType), uint32 (read as LongType)     the value as int64, 8 bytes LE
timestamp[any unit, any tz]                     microseconds since the epoch as int64, 8
(TimestampType, TimestampNTZType)               bytes LE; the raw stored value (UTC for
                                                zoned, wall clock for naive), ns floored
float32 (FloatType)                             IEEE bits as int32, 4 bytes LE; -0.0 -> 0.0,
                                                every NaN -> 0x7fc00000
float64 (DoubleType)                            IEEE bits as int64, 8 bytes LE; -0.0 -> 0.0,
                                                every NaN -> 0x7ff8000000000000
decimal(p, s), p <= 18 (DecimalType(p, s))      the unscaled integer as int64, 8 bytes LE
decimal(p, s), 18 < p <= 38                     the unscaled integer as minimal big-endian
                                                two's complement (Java
                                                ``BigInteger.toByteArray``), 1 to 16 bytes
string, large_string, string_view (StringType)  UTF-8 bytes (Spark: UTF8_BINARY collation)
binary, large_binary, fixed_size_binary,        the bytes
binary_view (BinaryType)
null (NullType)                                 nothing: always NULL
=============================================  ============================================

Dictionary-encoded columns hash as their values. The hash depends on the declared
type: the int32 5 and the int64 5 hash differently, and so do decimal(10, 2) and
decimal(20, 2). Any other type (nested, interval, time, float16, uint64, ...)
raises :class:`~reconcile.core.contract.InvalidInputError` naming the column.

:func:`row_hash_arrow` computes it vectorized on Arrow data (numpy XXH64, no Python
loop over rows); :func:`reconcile.core.hashing_scalar.row_hash` computes it for one row with the
``xxhash`` package; :func:`reconcile.spark.hashing.row_hash_column` builds it as a native
Spark expression. All three give identical int64 values.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from decimal import Context
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa  # type: ignore[import-untyped]

from reconcile.core.contract import InvalidInputError
from reconcile.core.xxh64 import (
    U64,
    hash_bytes_fixed,
    hash_bytes_padded,
    hash_int32,
    hash_int64,
    to_signed,
)

__all__ = ["HASH_SEED", "hash_kind", "null_mask_words", "row_hash_arrow"]

HASH_SEED = 42
MASK64 = (1 << 64) - 1
DOUBLE_NAN_BITS = 0x7FF8000000000000
FLOAT_NAN_BITS = 0x7FC00000
EPOCH_DATE = dt.date(1970, 1, 1)
EPOCH_NAIVE = dt.datetime(1970, 1, 1)
EPOCH_UTC = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
ONE_US = dt.timedelta(microseconds=1)
# Exact for 38-digit decimals (the default context rounds to 28 digits).
DECIMAL_CONTEXT = Context(prec=100)
US_PER_UNIT = {"s": 1_000_000, "ms": 1_000, "us": 1}
# Rows per slice of a large batch: bounds the numpy temporaries to some hundreds of MiB.
_SLICE_ROWS = 1 << 18
# Cap on rows * padded width of one byte matrix, for the same reason.
_MAX_MATRIX_BYTES = 1 << 24
# Up to this many distinct byte lengths in a slice, strings are hashed one length at a time.
_MAX_EXACT_LENGTHS = 64


def hash_kind(name: str, dtype: pa.DataType) -> str:
    """Classify an Arrow type by how the canonical hash encodes it.

    Args:
        name: the column name, for the error message.
        dtype: the column's Arrow type.

    Returns:
        One of ``null, bool, int, long, float, double, decimal_long, decimal_bytes,
        date, timestamp, bytes``.

    Raises:
        InvalidInputError: the type has no canonical hash; names the column and type.
    """
    t = pa.types
    if t.is_dictionary(dtype):
        return hash_kind(name, dtype.value_type)
    if t.is_null(dtype):
        return "null"
    if t.is_boolean(dtype):
        return "bool"
    if dtype in (pa.int8(), pa.int16(), pa.int32(), pa.uint8(), pa.uint16()):
        return "int"
    if dtype in (pa.int64(), pa.uint32()):
        return "long"
    if t.is_float32(dtype):
        return "float"
    if t.is_float64(dtype):
        return "double"
    if t.is_decimal(dtype) and dtype.precision <= 38:
        return "decimal_long" if dtype.precision <= 18 else "decimal_bytes"
    if t.is_date(dtype):
        return "date"
    if t.is_timestamp(dtype):
        return "timestamp"
    if (
        t.is_string(dtype)
        or t.is_large_string(dtype)
        or t.is_string_view(dtype)
        or t.is_binary(dtype)
        or t.is_large_binary(dtype)
        or t.is_fixed_size_binary(dtype)
        or t.is_binary_view(dtype)
    ):
        return "bytes"
    raise InvalidInputError(
        f"column {name!r} has type {dtype} which the row hash does not support "
        "(supported: bool, int8-64, uint8-32, float32/64, decimal up to 38 digits, "
        "date, timestamp, string, binary, null)",
        column=name,
        type=str(dtype),
    )


def null_mask_words(null_flags: Sequence[bool]) -> list[int]:
    """The null-mask words of one row, as signed int64 values.

    Args:
        null_flags: for each hashed column in order, whether it is NULL.

    Returns:
        ``ceil(n / 64)`` words; bit ``b`` of word ``j`` is column ``64*j + b``.
    """
    words = []
    for start in range(0, len(null_flags), 64):
        word = sum(1 << b for b, is_null in enumerate(null_flags[start : start + 64]) if is_null)
        words.append(word - (1 << 64) if word >= 1 << 63 else word)
    return words


# ---------------------------------------------------------------------------
# Vectorized (Arrow) implementation
# ---------------------------------------------------------------------------


def _numpy(arr: pa.Array, fill: Any) -> npt.NDArray[Any]:
    filled = arr.fill_null(fill) if arr.null_count else arr
    out: npt.NDArray[Any] = filled.to_numpy(zero_copy_only=False)
    return out


def _hash_var(
    data: npt.NDArray[np.uint8],
    starts: npt.NDArray[np.int64],
    lengths: npt.NDArray[np.int64],
    seeds: U64,
) -> U64:
    """Hash ``data[starts[i] : starts[i] + lengths[i]]`` for every row, in width classes.

    Rows are grouped by padded width (the next power of two above the length, at
    least 8) so the padding at most doubles the work; each group is gathered into a
    ``(rows, width)`` matrix through a strided window view, without an index matrix.
    """
    out = np.empty(len(starts), dtype=np.uint64)
    if len(starts) == 0:
        return out
    widths = np.maximum(8, 2 ** np.ceil(np.log2(lengths + 1)).astype(np.int64))
    # Copy only the bytes this slice uses (a slice shares its parent's whole buffer),
    # plus zero padding so every row's window fits.
    low = int(starts.min())
    high = int((starts + lengths).max())
    padded = np.concatenate([data[low:high], np.zeros(int(widths.max()), dtype=np.uint8)])
    starts = starts - low
    distinct = np.unique(lengths)
    if len(distinct) <= _MAX_EXACT_LENGTHS:
        # Few distinct lengths (the usual case): one unmasked pass per length.
        for length in distinct.tolist():
            width = max(8, -(-length // 8) * 8)
            window = np.lib.stride_tricks.sliding_window_view(padded, width)
            rows = np.flatnonzero(lengths == length)
            step = max(1, _MAX_MATRIX_BYTES // width)
            for lo in range(0, len(rows), step):
                part = rows[lo : lo + step]
                mat = np.ascontiguousarray(window[starts[part]])
                out[part] = hash_bytes_fixed(mat, length, seeds[part])
        return out
    for width in np.unique(widths).tolist():
        window = np.lib.stride_tricks.sliding_window_view(padded, width)
        rows = np.flatnonzero(widths == width)
        step = max(1, _MAX_MATRIX_BYTES // width)
        for lo in range(0, len(rows), step):
            part = rows[lo : lo + step]
            mat = np.ascontiguousarray(window[starts[part]])
            out[part] = hash_bytes_padded(mat, lengths[part], seeds[part])
    return out


def _bytes_of(
    arr: pa.Array,
) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """The data buffer, start offsets and lengths of a string or binary array."""
    if pa.types.is_fixed_size_binary(arr.type):
        width = arr.type.byte_width
        buf = arr.buffers()[1]
        data = np.frombuffer(buf, dtype=np.uint8) if buf is not None else np.zeros(0, np.uint8)
        starts = (np.arange(len(arr), dtype=np.int64) + arr.offset) * width
        return data, starts, np.full(len(arr), width, dtype=np.int64)
    arr = arr.cast(pa.large_binary())
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int64)[
        arr.offset : arr.offset + len(arr) + 1
    ]
    buf = arr.buffers()[2]
    data = np.frombuffer(buf, dtype=np.uint8) if buf is not None else np.zeros(0, np.uint8)
    starts = offsets[:-1].astype(np.int64)
    return data, starts, (offsets[1:] - offsets[:-1]).astype(np.int64)


def _decimal_words(arr: pa.Array) -> npt.NDArray[np.uint8]:
    """The 16-byte little-endian unscaled integers of a decimal array, ``(rows, 16)``."""
    dtype = arr.type
    if not pa.types.is_decimal128(dtype):
        arr = arr.cast(pa.decimal128(dtype.precision, dtype.scale))
    raw = np.frombuffer(arr.buffers()[1], dtype=np.uint8).reshape(-1, 16)
    return raw[arr.offset : arr.offset + len(arr)]


def _hash_column(arr: pa.Array, kind: str, seeds: U64) -> U64:
    """The next running hash for every row (NULL rows are masked by the caller)."""
    if kind == "bool":
        return hash_int32(_numpy(arr, False).astype(np.uint64), seeds)
    if kind == "int":
        ints = _numpy(arr, 0).astype(np.int32).view(np.uint32)
        return hash_int32(ints.astype(np.uint64), seeds)
    if kind == "date":
        if pa.types.is_date64(arr.type):
            days = _numpy(arr.cast(pa.int64()), 0) // 86_400_000
        else:
            days = _numpy(arr.cast(pa.int32()), 0)
        return hash_int32(days.astype(np.int32).view(np.uint32).astype(np.uint64), seeds)
    if kind == "long":
        return hash_int64(_numpy(arr, 0).astype(np.int64).view(np.uint64), seeds)
    if kind == "timestamp":
        unit = arr.type.unit
        raw = _numpy(arr.cast(pa.int64()), 0).astype(np.int64)
        micros = raw // 1000 if unit == "ns" else raw * US_PER_UNIT[unit]
        return hash_int64(micros.view(np.uint64), seeds)
    if kind == "double":
        d = _numpy(arr, 0.0).astype(np.float64)
        bits = np.where(d == 0.0, 0.0, d).view(np.uint64)
        bits = np.where(np.isnan(d), np.uint64(DOUBLE_NAN_BITS), bits)
        return hash_int64(bits, seeds)
    if kind == "float":
        f = _numpy(arr, 0.0).astype(np.float32)
        fbits = np.where(f == 0.0, np.float32(0.0), f).view(np.uint32)
        fbits = np.where(np.isnan(f), np.uint32(FLOAT_NAN_BITS), fbits)
        return hash_int32(fbits.astype(np.uint64), seeds)
    if kind == "decimal_long":
        return hash_int64(np.ascontiguousarray(_decimal_words(arr)[:, :8]).view("<u8")[:, 0], seeds)
    if kind == "decimal_bytes":
        big_endian = np.ascontiguousarray(_decimal_words(arr)[:, ::-1])
        sign = np.where(big_endian[:, 0] >= 0x80, 0xFF, 0x00).astype(np.uint8)
        is_sign = big_endian == sign[:, None]
        first = np.argmin(is_sign, axis=1)  # first byte that is not a sign-extension byte
        top_bit = big_endian[np.arange(len(first)), first] >> 7
        start = first - (top_bit != (sign >> 7)).astype(np.int64)
        start = np.where(is_sign.all(axis=1), 15, start).astype(np.int64)
        row_base = np.arange(len(start), dtype=np.int64) * 16
        return _hash_var(big_endian.ravel(), row_base + start, 16 - start, seeds)
    # kind == "bytes"
    data, starts, lengths = _bytes_of(arr)
    return _hash_var(data, starts, lengths, seeds)


def _hash_batch(arrays: Sequence[pa.Array], kinds: Sequence[str]) -> U64:
    rows = len(arrays[0])
    seeds = np.full(rows, HASH_SEED, dtype=np.uint64)
    mask_words = np.zeros(((len(arrays) + 63) // 64, rows), dtype=np.uint64)
    for i, (arr, kind) in enumerate(zip(arrays, kinds, strict=True)):
        if pa.types.is_dictionary(arr.type):
            arr = arr.dictionary_decode()
        if kind == "null" or arr.null_count == rows:
            mask_words[i // 64] |= np.uint64(1 << (i % 64))
            continue
        hashed = _hash_column(arr, kind, seeds)
        if arr.null_count:
            valid = arr.is_valid().to_numpy(zero_copy_only=False)
            seeds = np.where(valid, hashed, seeds)
            mask_words[i // 64] |= np.where(valid, np.uint64(0), np.uint64(1 << (i % 64)))
        else:
            seeds = hashed
    for word in mask_words:
        seeds = hash_int64(word, seeds)
    return seeds


def row_hash_arrow(
    table: pa.Table | pa.RecordBatch, columns: Sequence[str] | None = None
) -> pa.Int64Array:
    """Compute the canonical row hash of every row of an Arrow table, vectorized.

    Args:
        table: the rows.
        columns: the columns to hash, in hash order; default: all, in schema order.

    Returns:
        One int64 per row, never NULL, equal to Spark's value for the same row.

    Raises:
        InvalidInputError: no columns, a column that does not exist, or a column
            whose type has no canonical hash.
    """
    names = list(table.schema.names if columns is None else columns)
    if not names:
        raise InvalidInputError("row_hash_arrow() needs at least one column to hash")
    missing = [c for c in names if c not in table.schema.names]
    if missing:
        raise InvalidInputError(
            f"row_hash_arrow(): columns {missing} are not in the schema {table.schema.names}",
            columns=missing,
        )
    kinds = [hash_kind(c, table.schema.field(c).type) for c in names]
    if isinstance(table, pa.RecordBatch):
        table = pa.Table.from_batches([table])
    selected = table.select(names)
    batches = [b for b in selected.to_batches(max_chunksize=_SLICE_ROWS) if b.num_rows]

    def hashed(batch: pa.RecordBatch) -> npt.NDArray[np.int64]:
        return to_signed(_hash_batch(batch.columns, kinds))

    workers = min(len(batches), os.cpu_count() or 1)
    if workers > 1:
        # numpy lets go of the GIL in its array loops: slices hash side by side
        # (about 1.8x on two cores for ten million rows), in their order.
        with ThreadPoolExecutor(workers, thread_name_prefix="row-hash") as pool:
            parts = list(pool.map(hashed, batches))
    else:
        parts = [hashed(b) for b in batches]
    out = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    result: pa.Int64Array = pa.array(out, type=pa.int64())
    return result
