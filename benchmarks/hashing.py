"""Benchmark: the row hash in Python (vectorized) and in Spark, and the Spark bridge writing.

Run: ``.venv/bin/python -m benchmarks.hashing [--rows 10000000] [--out DIR]``. Writes
``hashing.json`` and ``hashing.md`` into ``--out`` (default ``benchmarks/results``).
Figures are rows per second of wall time on this machine; no test asserts them.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from benchmarks.report import RESULTS, machine, versions, write_report

COLUMNS = ["k", "name", "score", "ts"]
# The same four columns in Spark SQL: long key, short string, double with NULLs, timestamp.
SPARK_COLUMNS = [
    "id AS k",
    "concat('name-', CAST(id AS STRING)) AS name",
    "IF(id % 7 = 0, NULL, id / 3.0D) AS score",
    "timestamp_micros(1700000000000000 + id * 1000) AS ts",
]


def arrow_rows(rows: int) -> pa.Table:
    """The benchmark rows as Arrow, built without a Python loop."""
    k = np.arange(rows, dtype=np.int64)
    score = pa.array(k / 3.0, mask=(k % 7 == 0))
    name = pc.binary_join_element_wise("name-", pc.cast(pa.array(k), pa.string()), "")
    ts = pa.array(1_700_000_000_000_000 + k * 1000, pa.timestamp("us", tz="UTC"))
    return pa.table({"k": k, "name": name, "score": score, "ts": ts})


def best_of(runs: int, fn: Callable[[], Any]) -> float:
    """The fastest of ``runs`` timed calls, in seconds."""
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def bench_python(rows: int) -> float:
    from reconcile.core.hashing import row_hash_arrow

    table = arrow_rows(rows)
    row_hash_arrow(table.slice(0, 100_000))  # warm-up
    return rows / best_of(2, lambda: row_hash_arrow(table, COLUMNS))


def bench_spark(spark: Any, rows: int) -> float:
    from pyspark.sql import functions as F

    from reconcile.spark.hashing import row_hash_column

    df = spark.range(rows, numPartitions=4).selectExpr(*SPARK_COLUMNS)
    hashed = df.select(row_hash_column(COLUMNS, df.schema).alias("h"))
    # bit_xor forces every hash to be computed; only one number reaches the driver.
    hashed.agg(F.bit_xor("h")).collect()  # warm-up (codegen, JIT)
    return rows / best_of(2, lambda: hashed.agg(F.bit_xor("h")).collect())


def bench_bridge(spark: Any, rows: int, workdir: Path) -> float:
    from expected_state.spark_bridge import write_delta

    df = spark.range(rows, numPartitions=4).selectExpr(*SPARK_COLUMNS)
    write_delta(df.limit(1000), str(workdir / "warm"), app_id="bench", version=0)
    start = time.perf_counter()
    result = write_delta(df, str(workdir / "t"), app_id="bench", version=1)
    elapsed = time.perf_counter() - start
    assert result.committed and result.rows == rows, result
    return rows / elapsed


def markdown(report: dict[str, Any]) -> str:
    rows = report["scale"]["rows"]
    return "\n".join(
        [
            "# Row hash and Spark bridge benchmark",
            "",
            f"Scale: {rows:,} rows of (long key, short string, double with 1/7 NULLs, "
            "timestamp); one run, best of 2 for the hashes.",
            f"Machine: {report['machine']['cpus']} CPUs, {report['machine']['memory_gib']} GiB, "
            f"Spark `{report['machine']['spark_master']}`; {report['machine']['platform']}.",
            "",
            "| measure | rows/s |",
            "|---|---:|",
            f"| canonical hash, Python (numpy, vectorized) | "
            f"{report['hash_python_rows_per_s']:,.0f} |",
            f"| canonical hash, Spark (`xxhash64` + null mask) | "
            f"{report['hash_spark_rows_per_s']:,.0f} |",
            f"| Spark bridge write (Parquet + one Delta commit) | "
            f"{report['bridge_write_rows_per_s']:,.0f} |",
            "",
            "How: `.venv/bin/python -m benchmarks.hashing --rows "
            f"{rows}`. Python hashes an in-memory Arrow table; Spark hashes `spark.range` rows "
            "and XOR-aggregates the hashes; the bridge writes the rows from executors to "
            "Parquet and commits them in one tokened Delta commit.",
            "",
            "Versions: " + ", ".join(f"{k} {v}" for k, v in report["versions"].items()) + ".",
            "",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    """Run the three measurements and write the JSON and Markdown reports."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from reconcile.spark.session import local_session

    python_rate = bench_python(args.rows)
    print(f"python hash: {python_rate:,.0f} rows/s", flush=True)
    spark = local_session("reconcile-benchmark")
    spark.sparkContext.setLogLevel("ERROR")
    workdir = Path(tempfile.mkdtemp(prefix="bench-bridge-"))
    try:
        spark_rate = bench_spark(spark, args.rows)
        print(f"spark hash: {spark_rate:,.0f} rows/s", flush=True)
        bridge_rate = bench_bridge(spark, args.rows, workdir)
        print(f"bridge write: {bridge_rate:,.0f} rows/s", flush=True)
    finally:
        spark.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    report = {
        "hash_python_rows_per_s": round(python_rate),
        "hash_spark_rows_per_s": round(spark_rate),
        "bridge_write_rows_per_s": round(bridge_rate),
        "scale": {"rows": args.rows, "columns": COLUMNS},
        "machine": machine(spark_master="local[2]"),
        "versions": versions("numpy", "pyarrow", "pyspark", "deltalake", "xxhash"),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    write_report("hashing", report, markdown(report), args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
