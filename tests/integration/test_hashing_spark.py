"""The canonical row hash in Spark equals the Python one: pinned vectors and 10k random rows."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reconcile.core.contract import InvalidInputError
from reconcile.core.hashing import row_hash_arrow
from reconcile.spark.hashing import row_hash_column, row_hash_sql
from tests.unit.test_hashing import EXPECTED, MOVE, MULTI, SINGLE, VECTORS

pytestmark = [pytest.mark.integration]


def spark_hashes(spark: Any, table: pa.Table, path: Path, columns: list[str]) -> list[int]:
    """Hash ``table`` in Spark after a Parquet round trip, in row order."""
    indexed = table.append_column("_idx", pa.array(np.arange(table.num_rows, dtype=np.int64)))
    pq.write_table(indexed, path)
    df = spark.read.parquet(str(path))
    rows = df.select("_idx", row_hash_column(columns, df.schema).alias("h")).collect()
    return [r["h"] for r in sorted(rows, key=lambda r: r["_idx"])]


def test_pinned_vectors_in_spark(spark: Any, tmp_path: Path) -> None:
    # All single-column vectors side by side in one row, hashed column by column in one job.
    wide = pa.table({name: pa.array([v], t) for name, t, v in SINGLE})
    pq.write_table(wide, tmp_path / "single.parquet")
    df = spark.read.parquet(str(tmp_path / "single.parquet"))
    row = df.select(*[row_hash_column([n], df.schema).alias(n) for n, _, _ in SINGLE]).first()
    assert {n: row[n] for n, _, _ in SINGLE} == {n: EXPECTED[n] for n, _, _ in SINGLE}
    for group in (MULTI, MOVE):
        names = [n for n, _ in group]
        table = pa.concat_tables([VECTORS[n] for n in names])
        got = spark_hashes(spark, table, tmp_path / f"{names[0]}.parquet", table.column_names)
        assert dict(zip(names, got, strict=True)) == {n: EXPECTED[n] for n in names}


def test_sql_expression_equals_column(spark: Any, tmp_path: Path) -> None:
    table = pa.concat_tables([VECTORS[n] for n, _ in MULTI])
    pq.write_table(table, tmp_path / "m.parquet")
    df = spark.read.parquet(str(tmp_path / "m.parquet"))
    df.createOrReplaceTempView("hash_vectors")
    got = [
        r[0]
        for r in spark.sql(f"SELECT {row_hash_sql(['a', 'b', 'c'])} FROM hash_vectors").collect()
    ]
    assert sorted(got) == sorted(EXPECTED[n] for n, _ in MULTI)


def test_unsupported_spark_type_names_column(spark: Any) -> None:
    df = spark.sql("SELECT 1 AS ok, array(1, 2) AS bad_col")
    with pytest.raises(InvalidInputError, match="bad_col"):
        row_hash_column(["ok", "bad_col"], df.schema)
    with pytest.raises(InvalidInputError, match="missing_col"):
        row_hash_column(["missing_col"], df.schema)


# Types the random tables draw their columns from.
TYPES: dict[str, pa.DataType] = {
    "bool": pa.bool_(),
    "int8": pa.int8(),
    "int16": pa.int16(),
    "int32": pa.int32(),
    "int64": pa.int64(),
    "float32": pa.float32(),
    "float64": pa.float64(),
    "dec9_2": pa.decimal128(9, 2),
    "dec18_4": pa.decimal128(18, 4),
    "dec19_0": pa.decimal128(19, 0),
    "dec38_10": pa.decimal128(38, 10),
    "string": pa.string(),
    "binary": pa.binary(),
    "date": pa.date32(),
    "ts_utc": pa.timestamp("us", tz="UTC"),
    "ts_ntz": pa.timestamp("us"),
}
_FLOAT_EDGES = [0.0, -0.0, np.nan, np.inf, -np.inf, 5e-324, 1.7976931348623157e308, -1.5]
_INT_RANGES = {"int8": 8, "int16": 16, "int32": 32, "int64": 64}


def random_column(kind: str, n: int, rng: np.random.Generator) -> pa.Array:
    """``n`` random values of one type, with edge values and about 15% NULLs."""
    dtype = TYPES[kind]
    values: Any
    if kind == "bool":
        values = rng.random(n) < 0.5
    elif kind in _INT_RANGES:
        bits = _INT_RANGES[kind]
        values = rng.integers(
            -(2 ** (bits - 1)), 2 ** (bits - 1) - 1, n, endpoint=True, dtype=np.int64
        )
        values[:4] = [-(2 ** (bits - 1)), 2 ** (bits - 1) - 1, 0, -1]
    elif kind.startswith("float"):
        mixed = np.where(rng.random(n) < 0.3, rng.choice(_FLOAT_EDGES, n), rng.normal(0, 1e6, n))
        with np.errstate(over="ignore"):  # the largest double becomes inf as a float32
            values = mixed.astype(np.float32 if kind == "float32" else np.float64)
    elif kind.startswith("dec"):
        digits = dtype.precision
        values = [
            Decimal(
                int(rng.integers(0, 10**9)) ** 5 % 10**digits * (1 if rng.random() < 0.5 else -1)
            ).scaleb(-dtype.scale)
            for _ in range(n)
        ]
    elif kind == "string":
        lengths = rng.integers(0, 60, n)
        points = rng.choice([0x7F, 0x7FF, 0xD7FF, 0x10FFFF], n)
        values = [
            "".join(chr(c if not 0xD800 <= c < 0xE000 else 0x41) for c in rng.integers(1, p, k))
            for k, p in zip(lengths, points, strict=True)
        ]
    elif kind == "binary":
        values = [rng.bytes(int(k)) for k in rng.integers(0, 120, n)]
    elif kind == "date":
        values = [
            dt.date(1970, 1, 1) + dt.timedelta(days=int(d))
            for d in rng.integers(-600_000, 2_900_000, n)
        ]
    else:
        values = rng.integers(-(2**60), 2**60, n, dtype=np.int64)
    nulls = rng.random(n) < 0.15
    return pa.array(values, type=dtype, mask=nulls)


@settings(
    max_examples=5,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    kinds=st.lists(st.sampled_from(sorted(TYPES)), min_size=1, max_size=8),
    seed=st.integers(0, 2**32 - 1),
)
def test_random_rows_equal_in_python_and_spark(
    spark: Any, tmp_path: Path, kinds: list[str], seed: int
) -> None:
    """5 derandomized examples of 2,000 rows each: 10k random rows hash identically."""
    rng = np.random.default_rng(seed)
    n = 2_000
    table = pa.table({f"c{i}_{k}": random_column(k, n, rng) for i, k in enumerate(kinds)})
    columns = table.column_names
    expected = row_hash_arrow(table).to_pylist()
    path = tmp_path / f"random_{seed}.parquet"
    assert spark_hashes(spark, table, path, columns) == expected
