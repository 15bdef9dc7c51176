"""Canonical row hash: pinned vectors (cross-checked against Spark 4.2), nulls, types, errors."""

from __future__ import annotations

import datetime as dt
import math
import struct
from decimal import Context, Decimal
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import xxhash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reconcile.core.contract import InvalidInputError
from reconcile.core.hashing import null_mask_words, row_hash_arrow
from reconcile.core.hashing_scalar import row_hash

UTC = dt.UTC

# One column ``v`` per vector: (id, Arrow type, value).
SINGLE: list[tuple[str, pa.DataType, Any]] = [
    ("bool_true", pa.bool_(), True),
    ("bool_false", pa.bool_(), False),
    ("int8_neg", pa.int8(), -128),
    ("int16", pa.int16(), 12345),
    ("int32_zero", pa.int32(), 0),
    ("int32_one", pa.int32(), 1),
    ("int32_neg", pa.int32(), -1),
    ("int32_max", pa.int32(), 2**31 - 1),
    ("int32_min", pa.int32(), -(2**31)),
    ("int64_zero", pa.int64(), 0),
    ("int64_neg", pa.int64(), -1),
    ("int64_max", pa.int64(), 2**63 - 1),
    ("int64_min", pa.int64(), -(2**63)),
    ("double_zero", pa.float64(), 0.0),
    ("double_neg_zero", pa.float64(), -0.0),
    ("double_nan", pa.float64(), math.nan),
    ("double_pos_inf", pa.float64(), math.inf),
    ("double_neg_inf", pa.float64(), -math.inf),
    ("double_1_5", pa.float64(), 1.5),
    ("double_tiny", pa.float64(), 5e-324),
    ("float_1_5", pa.float32(), 1.5),
    ("float_nan", pa.float32(), math.nan),
    ("float_neg_zero", pa.float32(), -0.0),
    ("dec_5_2", pa.decimal128(5, 2), Decimal("123.45")),
    ("dec_5_2_neg", pa.decimal128(5, 2), Decimal("-0.01")),
    ("dec_18_0_max", pa.decimal128(18, 0), Decimal("999999999999999999")),
    ("dec_19_0_zero", pa.decimal128(19, 0), Decimal("0")),
    ("dec_19_0_128", pa.decimal128(19, 0), Decimal("128")),
    ("dec_19_0_neg129", pa.decimal128(19, 0), Decimal("-129")),
    ("dec_38_10", pa.decimal128(38, 10), Decimal("-1234567890123456789012345678.0123456789")),
    ("dec_38_0_max", pa.decimal128(38, 0), Decimal("9" * 38)),
    ("string_empty", pa.string(), ""),
    ("string_ascii", pa.string(), "Spark"),
    ("string_latin", pa.string(), "héllo wörld"),
    ("string_cjk", pa.string(), "日本語のテキスト"),
    ("string_emoji", pa.string(), "🙂👍🏽"),
    ("string_long", pa.string(), "the quick brown fox jumps over the lazy dog, twice: " * 2),
    ("binary_empty", pa.binary(), b""),
    ("binary_zero", pa.binary(), b"\x00"),
    ("binary_range", pa.binary(), bytes(range(100))),
    ("date_epoch", pa.date32(), dt.date(1970, 1, 1)),
    ("date_leap", pa.date32(), dt.date(2024, 2, 29)),
    ("date_1900", pa.date32(), dt.date(1900, 1, 1)),
    ("ts_utc", pa.timestamp("us", tz="UTC"), dt.datetime(2024, 1, 1, 0, 0, 0, 123456, tzinfo=UTC)),
    (
        "ts_pre_epoch",
        pa.timestamp("us", tz="UTC"),
        dt.datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
    ),
    ("ts_ntz", pa.timestamp("us"), dt.datetime(2024, 1, 1, 12, 30)),
    ("null_int32", pa.int32(), None),
    ("null_string", pa.string(), None),
]

MULTI_SCHEMA = pa.schema([("a", pa.int64()), ("b", pa.string()), ("c", pa.float64())])
MULTI: list[tuple[str, tuple[Any, ...]]] = [
    ("row_full", (1, "alice", 2.5)),
    ("row_null_a", (None, "alice", 2.5)),
    ("row_null_b", (1, None, 2.5)),
    ("row_null_c", (1, "alice", None)),
    ("row_all_null", (None, None, None)),
]
MOVE_SCHEMA = pa.schema([("x", pa.int32()), ("y", pa.int32())])
MOVE: list[tuple[str, tuple[Any, ...]]] = [
    ("move_null_first", (None, 7)),
    ("move_null_second", (7, None)),
]

# Computed once by row_hash_arrow, row_hash and Spark 4.2.0's xxhash64 (through
# reconcile.spark.hashing.row_hash_column on the same rows read from Parquet), which
# agreed on every one; tests/integration/test_hashing_spark.py re-checks Spark.
EXPECTED: dict[str, int] = {
    "bool_true": -4698198733687874474,
    "bool_false": -2984540310115537990,
    "int8_neg": 1208996374008664524,
    "int16": 6311683526449653203,
    "int32_zero": -2984540310115537990,
    "int32_one": -4698198733687874474,
    "int32_neg": 6937786899213813508,
    "int32_max": 1146535163210942022,
    "int32_min": -8836205657154315787,
    "int64_zero": -9199931545335556226,
    "int64_neg": 6862433990644673549,
    "int64_max": -6754354482691605594,
    "int64_min": -8034293315319268251,
    "double_zero": -9199931545335556226,
    "double_neg_zero": -9199931545335556226,
    "double_nan": 4502138278512166582,
    "double_pos_inf": 6194650631470107758,
    "double_neg_inf": -4897915015444099441,
    "double_1_5": 4084506597711912419,
    "double_tiny": -2220782197575308967,
    "float_1_5": -4106601514199547922,
    "float_nan": -1570884933046826847,
    "float_neg_zero": -2984540310115537990,
    "dec_5_2": 564702246319517932,
    "dec_5_2_neg": 6862433990644673549,
    "dec_18_0_max": -4491042811694641073,
    "dec_19_0_zero": -3377404466633830332,
    "dec_19_0_128": 3856890101166087067,
    "dec_19_0_neg129": 7580030776346181788,
    "dec_38_10": 199115121316677064,
    "dec_38_0_max": 7909179043304761258,
    "string_empty": 1172808402238552441,
    "string_ascii": -6396398850432463189,
    "string_latin": 443311565005614386,
    "string_cjk": 6483458409869847623,
    "string_emoji": -7462492145290106302,
    "string_long": -2576163124572520683,
    "binary_empty": 1172808402238552441,
    "binary_zero": -3377404466633830332,
    "binary_range": -2766785951184599001,
    "date_epoch": -2984540310115537990,
    "date_leap": -1871117035393844490,
    "date_1900": -8882489360927324804,
    "ts_utc": 4086740935500483268,
    "ts_pre_epoch": 6862433990644673549,
    "ts_ntz": 42248037303223619,
    "null_int32": -7001672635703045582,
    "null_string": -7001672635703045582,
    "row_full": -4136219535334643159,
    "row_null_a": -1517866448958212527,
    "row_null_b": -9105088312249147912,
    "row_null_c": -8583307186405164786,
    "row_all_null": -2864211556195259663,
    "move_null_first": -2902180901310600604,
    "move_null_second": 9092172474032097206,
}


def vector_tables() -> dict[str, pa.Table]:
    """Every pinned vector as a one-row Arrow table (shared with the Spark test)."""
    tables = {name: pa.table({"v": pa.array([v], t)}) for name, t, v in SINGLE}
    for name, values in MULTI:
        tables[name] = pa.Table.from_pylist(
            [dict(zip("abc", values, strict=True))], schema=MULTI_SCHEMA
        )
    for name, values in MOVE:
        tables[name] = pa.Table.from_pylist(
            [dict(zip("xy", values, strict=True))], schema=MOVE_SCHEMA
        )
    return tables


VECTORS = vector_tables()


@pytest.mark.parametrize("name", sorted(VECTORS))
def test_pinned_vector_vectorized_and_scalar(name: str) -> None:
    table = VECTORS[name]
    assert row_hash_arrow(table).to_pylist() == [EXPECTED[name]]
    assert row_hash(table.to_pylist()[0], table.schema) == EXPECTED[name]


def test_definition_is_chained_xxh64_with_null_mask() -> None:
    # row (a=1, b="alice", c=NULL): seed 42 -> long 1 -> UTF-8 "alice" -> mask word 0b100.
    h = xxhash.xxh64_intdigest(struct.pack("<q", 1), seed=42)
    h = xxhash.xxh64_intdigest(b"alice", seed=h)
    h = xxhash.xxh64_intdigest(struct.pack("<q", 0b100), seed=h)
    signed = h - (1 << 64) if h >= 1 << 63 else h
    assert signed == EXPECTED["row_null_c"]
    assert null_mask_words([False, False, True]) == [4]


def test_negative_zero_and_nan_payloads_normalised() -> None:
    assert EXPECTED["double_neg_zero"] == EXPECTED["double_zero"]
    other_nan = struct.unpack("<d", struct.pack("<Q", 0x7FF0000000000001))[0]
    neg_nan = struct.unpack("<d", struct.pack("<Q", 0xFFF8000000000000))[0]
    table = pa.table({"v": pa.array([math.nan, other_nan, neg_nan], pa.float64())})
    assert row_hash_arrow(table).to_pylist() == [EXPECTED["double_nan"]] * 3
    f32 = pa.table({"v": pa.array(np.array([np.nan, -np.nan], dtype=np.float32))})
    assert row_hash_arrow(f32).to_pylist() == [EXPECTED["float_nan"]] * 2


def test_null_in_every_position_gives_distinct_hashes() -> None:
    names = [n for n, _ in MULTI]
    assert len({EXPECTED[n] for n in names}) == len(names)
    assert EXPECTED["move_null_first"] != EXPECTED["move_null_second"]
    # Without the mask the two would collide: Spark's xxhash64 skips NULLs.
    bare = xxhash.xxh64_intdigest(struct.pack("<i", 7), seed=42)
    masked_first = xxhash.xxh64_intdigest(struct.pack("<q", 0b01), seed=bare)
    masked_second = xxhash.xxh64_intdigest(struct.pack("<q", 0b10), seed=bare)
    assert masked_first != masked_second


def test_null_mask_spans_more_than_64_columns() -> None:
    names = [f"c{i}" for i in range(70)]
    rows: list[dict[str, int | None]] = [dict.fromkeys(names, 1) for _ in range(3)]
    rows[1]["c0"] = None
    rows[2]["c64"] = None
    table = pa.Table.from_pylist(rows, schema=pa.schema([(n, pa.int32()) for n in names]))
    hashes = row_hash_arrow(table).to_pylist()
    assert len(set(hashes)) == 3
    assert hashes == [row_hash(r, table.schema) for r in rows]
    assert null_mask_words([i == 63 for i in range(70)]) == [-(1 << 63), 0]


def test_equivalent_arrow_encodings_hash_alike() -> None:
    words = ["", "a", "héllo", "日本語", None, "a" * 70]
    base = row_hash_arrow(pa.table({"v": pa.array(words, pa.string())})).to_pylist()
    for t in (pa.large_string(), pa.string_view()):
        assert row_hash_arrow(pa.table({"v": pa.array(words, t)})).to_pylist() == base
    encoded = pa.array(words, pa.string()).dictionary_encode()
    assert row_hash_arrow(pa.table({"v": encoded})).to_pylist() == base
    fixed = pa.array([b"abcd", None, b"\x00\x00\x00\x00"], pa.binary(4))
    plain = pa.array([b"abcd", None, b"\x00\x00\x00\x00"], pa.binary())
    assert row_hash_arrow(pa.table({"v": fixed})) == row_hash_arrow(pa.table({"v": plain}))
    for t in (pa.decimal32(5, 2), pa.decimal64(5, 2), pa.decimal256(5, 2)):
        value = pa.array([Decimal("123.45")], t)
        assert row_hash_arrow(pa.table({"v": value})).to_pylist() == [EXPECTED["dec_5_2"]]


def test_timestamp_units_normalise_to_microseconds() -> None:
    micros = 1_704_067_200_123_456
    expected = row_hash_arrow(pa.table({"v": pa.array([micros], pa.timestamp("us"))}))
    ns = pa.array([micros * 1000 + 999], pa.timestamp("ns"))
    assert row_hash_arrow(pa.table({"v": ns})) == expected
    ms = pa.array([1_704_067_200_123], pa.timestamp("ms"))
    ms_as_us = pa.array([1_704_067_200_123_000], pa.timestamp("us"))
    assert row_hash_arrow(pa.table({"v": ms})) == row_hash_arrow(pa.table({"v": ms_as_us}))


def test_column_order_and_selection() -> None:
    table = VECTORS["row_full"]
    assert row_hash_arrow(table, ["a", "b", "c"]).to_pylist() == [EXPECTED["row_full"]]
    assert row_hash_arrow(table, ["c", "b", "a"]).to_pylist() != [EXPECTED["row_full"]]
    batch = table.to_batches()[0]
    assert row_hash_arrow(batch).to_pylist() == [EXPECTED["row_full"]]


def test_many_rows_across_slices_and_chunks() -> None:
    rng = np.random.default_rng(7)
    n = 300_000  # more than one internal slice
    values = rng.integers(-(2**63), 2**63 - 1, n, dtype=np.int64)
    text = pa.array([f"k{v % 1000}" for v in values[:1000]] * (n // 1000))
    table = pa.table({"l": values, "s": text})
    chunked = pa.Table.from_batches(table.to_batches(max_chunksize=70_001))
    hashes = row_hash_arrow(chunked).to_numpy()
    assert (hashes == row_hash_arrow(table).to_numpy()).all()
    for i in (0, 70_001, 262_144, n - 1):
        assert hashes[i] == row_hash(table.slice(i, 1).to_pylist()[0], table.schema)
    assert row_hash_arrow(table.slice(0, 0)).to_pylist() == []


@pytest.mark.parametrize(
    "dtype",
    [pa.list_(pa.int32()), pa.uint64(), pa.time32("s"), pa.duration("us"), pa.float16()],
    ids=str,
)
def test_unsupported_type_names_column(dtype: pa.DataType) -> None:
    table = pa.table({"ok": pa.array([1]), "bad_col": pa.nulls(1, dtype)})
    with pytest.raises(InvalidInputError, match="bad_col"):
        row_hash_arrow(table)
    with pytest.raises(InvalidInputError, match="bad_col"):
        row_hash({"ok": 1, "bad_col": None}, table.schema)


def test_bad_calls_rejected() -> None:
    table = VECTORS["row_full"]
    with pytest.raises(InvalidInputError, match="nope"):
        row_hash_arrow(table, ["a", "nope"])
    with pytest.raises(InvalidInputError, match="at least one"):
        row_hash_arrow(table, [])
    with pytest.raises(InvalidInputError, match="'b'"):
        row_hash({"a": 1}, table.schema)
    with pytest.raises(InvalidInputError, match="decimal places"):
        row_hash({"v": Decimal("1.234")}, pa.schema([("v", pa.decimal128(5, 2))]))


ROW_SCHEMA = pa.schema(
    [
        ("b", pa.bool_()),
        ("i", pa.int32()),
        ("l", pa.int64()),
        ("d", pa.float64()),
        ("f", pa.float32()),
        ("m", pa.decimal128(12, 3)),
        ("big", pa.decimal128(38, 6)),
        ("s", pa.string()),
        ("y", pa.binary()),
        ("day", pa.date32()),
        ("ts", pa.timestamp("us", tz="UTC")),
    ]
)
_EXACT = Context(prec=100)
_FLOATS = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([0.0, -0.0, math.nan])
_DAYS = st.integers(-700_000, 700_000).map(lambda d: dt.date(1970, 1, 1) + dt.timedelta(days=d))
_MICROS = st.integers(-(2**62), 2**62)
ROWS = st.fixed_dictionaries(
    {
        "b": st.none() | st.booleans(),
        "i": st.none() | st.integers(-(2**31), 2**31 - 1),
        "l": st.none() | st.integers(-(2**63), 2**63 - 1),
        "d": st.none() | _FLOATS,
        "f": st.none() | st.floats(width=32),
        "m": st.none()
        | st.integers(-(10**12) + 1, 10**12 - 1).map(lambda u: Decimal(u).scaleb(-3, _EXACT)),
        "big": st.none()
        | st.integers(-(10**38) + 1, 10**38 - 1).map(lambda u: Decimal(u).scaleb(-6, _EXACT)),
        "s": st.none() | st.text(max_size=80),
        "y": st.none() | st.binary(max_size=80),
        "day": st.none() | _DAYS,
        "ts": st.none() | _MICROS,
    }
)


@settings(
    max_examples=60, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(st.lists(ROWS, min_size=1, max_size=40))
def test_vectorized_equals_scalar_reference(rows: list[dict[str, Any]]) -> None:
    """The numpy XXH64 agrees with the xxhash package on arbitrary rows."""
    table = pa.Table.from_pylist(rows, schema=ROW_SCHEMA)
    assert row_hash_arrow(table).to_pylist() == [row_hash(r, ROW_SCHEMA) for r in rows]


@pytest.mark.parametrize("distinct_lengths", [3, 300], ids=["exact-length", "width-classes"])
def test_byte_kernels_match_xxhash(distinct_lengths: int) -> None:
    """Both string paths (one length at a time; masked width classes) equal the xxhash package."""
    rng = np.random.default_rng(distinct_lengths)
    if distinct_lengths == 3:
        lengths = np.array([5, 37, 200])[np.arange(600) % 3]  # each path step, no masking
    else:
        lengths = rng.permutation(np.arange(600) % distinct_lengths)  # 0..299, masked classes
    values = [rng.bytes(int(n)) for n in lengths]
    hashes = row_hash_arrow(pa.table({"v": pa.array(values, pa.binary())})).to_pylist()
    for value, got in zip(values, hashes, strict=True):
        h = xxhash.xxh64_intdigest(value, seed=42)
        h = xxhash.xxh64_intdigest(struct.pack("<q", 0), seed=h)
        assert got == (h - (1 << 64) if h >= 1 << 63 else h)
