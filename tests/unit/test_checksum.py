"""The bucket checksum: pinned lookup3 vectors (read from PostgreSQL 15), field texts per kind.

``tests/integration/test_checksum_pg.py`` checks the same vectors, and random rows
of every kind, against a real server.
"""

from __future__ import annotations

import datetime as dt
import math
import uuid
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest

from reconcile.core.checksum import (
    SEED,
    pg_hash_bytes,
    pg_hash_text_arrow,
    row_checksums,
    row_text_arrow,
)
from reconcile.core.contract import InvalidInputError

# hashtextextended(text COLLATE "C", SEED) as PostgreSQL 15 returned it (signed int8).
HASH_VECTORS: list[tuple[str, int]] = [
    ("", -3372836394949390414),
    ("a", 5794312390605125881),
    ("ab", -8898859241168911456),
    ("abc", 6949614107346098221),
    ("abcd", -4072339711684544795),
    ("hello world!", 8389889112816873823),
    ("exactly 12 b", 1954348523599353620),
    ("thirteen byte", -3264677770082535089),
    ("1|5|true|2.5|0.0000001|0000000000000000|7fc00000", -750489235211829369),
    ("héllo wörld", 7233922010334080303),
    ("日本語", -4219922053698568186),
    ("🙂👍🏽", -5765360164680390608),
    ("x" * 100, 410918154806364188),
]

# (kind, Arrow type, value, field text): one per rule of the definition.
FIELD_VECTORS: list[tuple[str, pa.DataType, Any, str]] = [
    ("int", pa.int64(), -12, "-12"),
    ("int", pa.int16(), 7, "7"),
    ("bool", pa.bool_(), True, "true"),
    ("bool", pa.bool_(), False, "false"),
    ("numeric", pa.decimal128(12, 2), Decimal("2.50"), "2.5"),
    ("numeric", pa.decimal128(12, 2), Decimal("3.00"), "3"),
    ("numeric", pa.decimal128(12, 2), Decimal("-0.50"), "-0.5"),
    ("numeric", pa.decimal128(12, 2), Decimal("0.00"), "0"),
    ("numeric", pa.decimal128(38, 10), Decimal("1E-10"), "0.0000000001"),
    ("float8", pa.float64(), 1.0, "3ff0000000000000"),
    ("float8", pa.float64(), -0.0, "0000000000000000"),
    ("float8", pa.float64(), math.nan, "7ff8000000000000"),
    ("float8", pa.float64(), -math.inf, "fff0000000000000"),
    ("float4", pa.float32(), 1.5, "3fc00000"),
    ("float4", pa.float32(), math.nan, "7fc00000"),
    ("date", pa.date32(), dt.date(2000, 1, 1), "00000000"),
    ("date", pa.date32(), dt.date(1999, 12, 31), "ffffffff"),
    ("timestamp", pa.timestamp("us"), dt.datetime(2000, 1, 1, 0, 0, 0, 1), "0000000000000001"),
    ("timestamp", pa.timestamp("ns"), dt.datetime(2000, 1, 1, 0, 0, 1), "00000000000f4240"),
    (
        "timestamptz",
        pa.timestamp("us", tz="UTC"),
        dt.datetime(1999, 12, 31, 23, 59, 59, 999999, tzinfo=dt.UTC),
        "ffffffffffffffff",
    ),
    ("text", pa.string(), "", "0:"),
    ("text", pa.string(), "héllo|x", "8:héllo|x"),
    (
        "uuid",
        pa.string(),
        "00000000-0000-0000-0000-000000003039",
        "00000000-0000-0000-0000-000000003039",
    ),
    (
        "uuid",
        pa.binary(16),
        uuid.UUID(int=12345).bytes,
        "00000000-0000-0000-0000-000000003039",
    ),
    ("bytes", pa.binary(), b"", "x"),
    ("bytes", pa.binary(), b"\x00\xff", "x00ff"),
]


def signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


@pytest.mark.parametrize(
    ("text", "want"), HASH_VECTORS, ids=[repr(t)[:20] for t, _ in HASH_VECTORS]
)
def test_lookup3_matches_postgres_vectors(text: str, want: int) -> None:
    assert signed(pg_hash_bytes(text.encode(), SEED)) == want
    vectorized = pg_hash_text_arrow(pa.array(["pad", text, "x" * 30]))
    assert signed(int(vectorized[1])) == want


def test_vectorized_equals_scalar_at_every_length() -> None:
    texts = ["".join(chr(97 + (i * 7 + j) % 26) for j in range(n)) for i, n in enumerate(range(70))]
    hashes = pg_hash_text_arrow(pa.array(texts))
    assert [int(h) for h in hashes] == [pg_hash_bytes(t.encode(), SEED) for t in texts]
    sliced = pa.array(texts).slice(13, 20)
    assert [int(h) for h in pg_hash_text_arrow(sliced)] == [int(h) for h in hashes[13:33]]


@pytest.mark.parametrize(("kind", "typ", "value", "text"), FIELD_VECTORS)
def test_field_texts(kind: str, typ: pa.DataType, value: Any, text: str) -> None:
    table = pa.table({"v": pa.array([value, None], typ)})
    assert row_text_arrow(table, [("v", kind)]).to_pylist() == [text, ""]


def test_the_row_text_is_unambiguous_for_nulls_moved_between_columns() -> None:
    table = pa.table({"a": pa.array([None, 7], pa.int64()), "b": pa.array([7, None], pa.int64())})
    texts = row_text_arrow(table, [("a", "int"), ("b", "int")]).to_pylist()
    assert texts == ["|7", "7|"]
    sums = row_checksums(table, [("a", "int"), ("b", "int")])
    assert sums[0] != sums[1]


def test_an_unsupported_kind_names_the_column() -> None:
    with pytest.raises(InvalidInputError, match=r"column .doc.*use mode full or scoped"):
        row_text_arrow(pa.table({"doc": ["{}"]}), [("doc", "other")])
