"""Bucket checksums: one canonical text per row and one 64-bit hash of it, in Python and in SQL.

Buckets mode compares per-bucket counts and checksums that the DATABASE computes
from the values it holds with the same figures computed here from the expected
state. Both sides must agree exactly, so the row's canonical text and its hash are
defined once, here, with the Python implementation (vectorized Arrow/numpy);
the SQL one (PostgreSQL) is the Postgres backend's, in
``sinks/postgres/checksum_sql.py``, beside the server it runs on. Pinned
vectors are checked against a real server in
``tests/integration/test_checksum_pg.py``.

Definition
----------

For the columns ``c_0 .. c_{n-1}`` of a row (the expected state's key and value
columns, in the store's order), each non-NULL value becomes a *field* by its
column's **checksum kind** (decided by the sink's column type):

============  ==============================  ==========================================
kind          PostgreSQL types                field text
============  ==============================  ==========================================
int           smallint, integer, bigint       the decimal integer (``-12``)
bool          boolean                         ``true`` or ``false``
numeric       numeric                         plain decimal, trailing fractional zeros and
                                              a bare point removed (``trim_scale``):
                                              ``2.50`` -> ``2.5``, ``3.00`` -> ``3``
float8        double precision                the IEEE bits as 16 lowercase hex digits,
                                              big-endian; -0.0 as 0.0, every NaN as
                                              ``7ff8000000000000``
float4        real                            the same on 32 bits (NaN ``7fc00000``)
date          date                            days since 2000-01-01 as a big-endian int32,
                                              8 hex digits (``date_send``)
timestamp     timestamp                       microseconds since 2000-01-01 00:00 as a
                                              big-endian int64, 16 hex digits
                                              (``timestamp_send``)
timestamptz   timestamptz                     the same, from 2000-01-01 00:00 UTC
text          text, varchar                   ``<UTF-8 byte length>:<the text>``
uuid          uuid                            the lowercase hyphenated form
bytes         bytea                           ``x`` then the bytes as lowercase hex
============  ==============================  ==========================================

A NULL is the empty field. The row text is the fields joined by ``|``. It is
unambiguous: only text fields may hold ``|`` or be empty, and they carry their
length, so a NULL moved from one column to another changes the text. The row's
checksum is PostgreSQL's ``hashtextextended(row_text COLLATE "C", SEED)``: Bob
Jenkins' lookup3 over the UTF-8 bytes with a 64-bit seed (``hash_bytes_extended``
in PostgreSQL's ``src/common/hashfn.c``), reimplemented in numpy in
``reconcile.core.lookup3``. A bucket's checksum is the sum of its rows' checksums
modulo 2**64, which does not depend on row order; with the row count it is
compared exactly.

Why not the canonical row hash (``reconcile.core.hashing``) itself: PostgreSQL has no
xxhash, and a PL/pgSQL one would be far slower than the pull it is meant to
avoid. Why not md5: the expected side would then hash 10M rows in a Python loop;
lookup3 vectorizes in numpy. The lookup3 result is the same on every
little-endian server; ``server_check_sql`` (the SQL side) lets a caller confirm it on a server
before trusting it (a big-endian server computes other values).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
import pyarrow.compute as pc  # type: ignore[import-untyped, unused-ignore]

from reconcile.core.contract import InvalidInputError
from reconcile.core.lookup3 import pg_hash_bytes as _pg_hash_bytes
from reconcile.core.lookup3 import pg_hash_text_arrow as _pg_hash_text_arrow

__all__ = [
    "KINDS",
    "SEED",
    "checksum_kind",
    "pg_hash_bytes",
    "pg_hash_text_arrow",
    "row_checksums",
    "row_text_arrow",
    "signed64",
]

U64 = npt.NDArray[np.uint64]

# hashtextextended's seed (any non-zero int64; "reconcil" in ASCII).
SEED = 0x7265636F6E63696C

# The recovery kinds (``reconcile.core.conform.SinkColumn.kind``) buckets mode
# checksums; which column type has which kind is the sink's type table's
# (``sinks.postgres.arrow_types.PG_TYPES``). char, json and jsonb are held as
# their value form's text (``reconcile.core.value_forms``): the field is that
# text, which the server side reads as the column gives it back.
KINDS = frozenset(
    {"int", "bool", "numeric", "float8", "float4", "date", "timestamp", "timestamptz",
     "text", "char", "jsonb", "uuid", "bytes"}
)  # fmt: skip
# Kinds whose field is the text the expected state holds, as for ``text``.
_TEXT_KINDS = frozenset({"text", "char", "jsonb"})
_SUPPORTED = KINDS
_SEP = "|"
_MASK32 = np.uint32(0xFFFFFFFF)
_EPOCH_2000_DAYS = 10_957  # 2000-01-01 - 1970-01-01
_EPOCH_2000_US = _EPOCH_2000_DAYS * 86_400 * 1_000_000
_US_PER_UNIT = {"s": 1_000_000, "ms": 1_000, "us": 1}
_HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
# Rows checksummed at once (``row_checksums``): their texts and hash matrices
# are the temporaries. Measured on TPC-H lineitem (16 columns): a batch of
# about 860,000 rows held 350 MB of them; 1<<17 rows hold about an eighth.
_BATCH_ROWS = 1 << 17


def checksum_kind(column: str, kind: str) -> str:
    """``kind`` if buckets mode checksums it.

    Raises:
        InvalidInputError: a kind buckets mode does not checksum, naming the column.
    """
    if kind not in _SUPPORTED:
        raise InvalidInputError(
            f"column {column!r} is of a type ({kind}) that buckets mode does not checksum "
            f"(supported: {', '.join(sorted(KINDS))}); use mode full or scoped",
            column=column,
            type=kind,
        )
    return kind


# ---------------------------------------------------------------------------
# Python side: the canonical text, vectorized over Arrow
# ---------------------------------------------------------------------------


# Byte -> its two lowercase hex digits, as one little-endian uint16 (the digits in order).
_HEX_PAIRS = _HEX[np.arange(256) >> 4].astype(np.uint16) | (
    _HEX[np.arange(256) & 0x0F].astype(np.uint16) << 8
)


def _hex_fixed(raw: npt.NDArray[np.uint8], width: int) -> pa.Array:
    """Rows of ``width`` bytes (a ``(rows, width)`` matrix) as lowercase hex strings."""
    rows = raw.shape[0]
    digits = _HEX_PAIRS[raw]  # (rows, width) uint16: two ASCII digits per byte
    offsets = np.arange(rows + 1, dtype=np.int32) * (width * 2)
    return pa.StringArray.from_buffers(
        rows, pa.py_buffer(offsets), pa.py_buffer(np.ascontiguousarray(digits).view(np.uint8))
    )


def _hex_variable(arr: pa.Array) -> pa.Array:
    """A binary array as lowercase hex strings (NULLs stay NULL)."""
    arr = arr.cast(pa.large_binary())
    n = len(arr)
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int64)[arr.offset : arr.offset + n + 1]
    buf = arr.buffers()[2]
    data = np.frombuffer(buf, dtype=np.uint8) if buf is not None else np.zeros(0, np.uint8)
    data = data[offsets[0] : offsets[-1]]
    digits = np.empty(len(data) * 2, dtype=np.uint8)
    digits[0::2] = _HEX[data >> 4]
    digits[1::2] = _HEX[data & 0x0F]
    new_offsets = (offsets - offsets[0]) * 2
    validity = arr.buffers()[0] if arr.null_count else None
    if validity is not None and arr.offset:
        validity = pa.array(arr.is_valid().to_numpy(zero_copy_only=False)).buffers()[1]
    return pa.LargeStringArray.from_buffers(
        n, pa.py_buffer(new_offsets.astype(np.int64)), pa.py_buffer(digits), validity
    )


def _big_endian_hex(values: npt.NDArray[Any], width: int) -> pa.Array:
    raw = values.astype(f">i{width}").view(np.uint8).reshape(-1, width)
    return _hex_fixed(raw, width)


def _numeric_text(arr: pa.Array) -> pa.Array:
    text = arr.cast(pa.string())
    # Arrow writes |x| < 1e-6 in scientific notation; PostgreSQL never does.
    sci = pc.match_substring(text, "E")
    if pc.any(sci).as_py():
        values = arr.to_pylist()
        flags = sci.to_pylist()
        shown = text.to_pylist()
        text = pa.array(
            [
                format(v, "f") if flag else t
                for v, t, flag in zip(values, shown, flags, strict=True)
            ],
            pa.string(),
        )
    has_point = pc.match_substring(text, ".")
    trimmed = pc.utf8_rtrim(pc.utf8_rtrim(text, "0"), ".")
    return pc.if_else(has_point, trimmed, text)


def _field_arrow(column: str, arr: pa.Array, kind: str) -> pa.Array:
    """The field text of every value (NULL for NULL), by checksum kind."""
    typ = arr.type
    if pa.types.is_dictionary(typ):
        arr = arr.dictionary_decode()
        typ = arr.type
    if pa.types.is_null(typ):
        return pa.nulls(len(arr), pa.string())
    valid = arr.is_valid()
    if kind in ("int", "bool"):
        return arr.cast(pa.string())
    if kind == "numeric":
        return _numeric_text(arr)
    if kind in ("float8", "float4"):
        width, ftype, utype, nan = (
            (8, np.float64, np.uint64, 0x7FF8000000000000)
            if kind == "float8"
            else (4, np.float32, np.uint32, 0x7FC00000)
        )
        f = arr.cast(pa.float64() if width == 8 else pa.float32()).fill_null(0.0).to_numpy()
        f = np.where(f == 0.0, ftype(0.0), f).astype(ftype)
        bits = np.where(np.isnan(f), utype(nan), f.view(utype)).astype(utype)
        out = _big_endian_hex(bits.view(np.int64 if width == 8 else np.int32), width)
        return pc.if_else(valid, out, pa.scalar(None, pa.string()))
    if kind == "date":
        days = arr.cast(pa.date32()).cast(pa.int32()).fill_null(0).to_numpy()
        out = _big_endian_hex((days - _EPOCH_2000_DAYS).astype(np.int32), 4)
        return pc.if_else(valid, out, pa.scalar(None, pa.string()))
    if kind in ("timestamp", "timestamptz"):
        raw = arr.cast(pa.int64()).fill_null(0).to_numpy().astype(np.int64)
        unit = typ.unit
        micros = raw // 1000 if unit == "ns" else raw * _US_PER_UNIT[unit]
        out = _big_endian_hex((micros - _EPOCH_2000_US).astype(np.int64), 8)
        return pc.if_else(valid, out, pa.scalar(None, pa.string()))
    if kind in _TEXT_KINDS:
        text = arr.cast(pa.large_string())
        lengths = pc.binary_length(text).cast(pa.string()).cast(pa.large_string())
        return pc.binary_join_element_wise(lengths, text, pa.scalar(":", pa.large_string()))
    if kind == "uuid":
        if pa.types.is_fixed_size_binary(typ) and typ.byte_width == 16:
            raw = np.frombuffer(arr.buffers()[1], dtype=np.uint8).reshape(-1, 16)
            raw = raw[arr.offset : arr.offset + len(arr)]
            digits = np.empty((len(arr), 32), dtype=np.uint8)
            digits[:, 0::2] = _HEX[raw >> 4]
            digits[:, 1::2] = _HEX[raw & 0x0F]
            hyphen = np.full((len(arr), 1), ord("-"), dtype=np.uint8)
            parts = [digits[:, 0:8], digits[:, 8:12], digits[:, 12:16], digits[:, 16:20]]
            text = np.hstack([p for part in parts for p in (part, hyphen)] + [digits[:, 20:]])
            offsets = np.arange(len(arr) + 1, dtype=np.int32) * 36
            out = pa.StringArray.from_buffers(
                len(arr), pa.py_buffer(offsets), pa.py_buffer(np.ascontiguousarray(text).tobytes())
            )
            return pc.if_else(valid, out, pa.scalar(None, pa.string()))
        return arr.cast(pa.string())
    if kind == "bytes":
        hexed = _hex_variable(arr)
        return pc.binary_join_element_wise(
            pa.scalar("x", pa.large_string()), hexed, pa.scalar("", pa.large_string())
        )
    raise InvalidInputError(f"column {column!r}: unknown checksum kind {kind!r}", column=column)


def row_text_arrow(table: pa.Table, columns: Sequence[tuple[str, str]]) -> pa.Array:
    """The canonical row text of every row of ``table``, vectorized.

    Args:
        table: the rows (at least the named columns), in the expected state's types.
        columns: (column name, checksum kind of the sink's column), in order.

    Returns:
        One (large) string per row, never NULL.
    """
    fields = []
    for name, kind in columns:
        column = table.column(name).combine_chunks()
        text = _field_arrow(name, column, checksum_kind(name, kind))
        fields.append(text.cast(pa.large_string()))
    if len(fields) == 1:
        return pc.fill_null(fields[0], "")
    return pc.binary_join_element_wise(
        *fields,
        pa.scalar(_SEP, pa.large_string()),
        null_handling="replace",
        null_replacement="",
    )


def pg_hash_bytes(data: bytes, seed: int = SEED) -> int:
    """``hashtextextended(data COLLATE "C", seed)`` of one byte string, as uint64."""
    return _pg_hash_bytes(data, seed)


def pg_hash_text_arrow(texts: pa.Array, seed: int = SEED) -> U64:
    """The same for every value of a string or binary array, vectorized."""
    return _pg_hash_text_arrow(texts, seed)


def row_checksums(table: pa.Table, columns: Sequence[tuple[str, str]]) -> U64:
    """The checksum of every row (uint64), equal to PostgreSQL's ``row_checksum_sql``.

    Args:
        table: the expected rows (in the expected state's types).
        columns: (column name, checksum kind), in checksum order.
    """
    parts = []
    # In batches of _BATCH_ROWS: the row texts and their hash's matrices are
    # held for one batch at a time, never for the table.
    for batch in table.select([c for c, _ in columns]).to_batches(max_chunksize=_BATCH_ROWS):
        if batch.num_rows:
            parts.append(pg_hash_text_arrow(row_text_arrow(pa.table(batch), columns)))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint64)


def signed64(value: int) -> int:
    value &= 0xFFFFFFFFFFFFFFFF
    return value - (1 << 64) if value >= 1 << 63 else value
