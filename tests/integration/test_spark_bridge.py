"""Spark bridge: time-travel reads, one tokened commit per write, replays, schema, crashes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import functions as F

from expected_state.delta_commit import DataFile, DeltaCommit, commit_files
from expected_state.spark_bridge import delta_jars_available, read_delta, write_delta
from reconcile.core.contract import InvalidInputError
from reconcile.core.hashing import row_hash_arrow
from reconcile.spark.hashing import row_hash_column

pytestmark = [pytest.mark.integration]

REPO = Path(__file__).resolve().parents[2]
APP = "pipe/sink"


def rows_of(spark: Any, start: int, count: int, partitions: int = 3) -> Any:
    """``count`` rows with keys ``start..``: a long key, a string, a double, a timestamp."""
    return spark.range(start, start + count, numPartitions=partitions).selectExpr(
        "id AS k",
        "concat('name-', CAST(id AS STRING)) AS name",
        "IF(id % 7 = 0, NULL, id / 3.0D) AS score",
        "timestamp_micros(id * 1000003) AS ts",
    )


def staging_dirs(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name.startswith("spark-"))


def committed_log_entries(root: Path) -> list[str]:
    return sorted(p.name for p in (root / "_delta_log").glob("*.json"))


def test_the_session_carries_delta_spark_and_both_readers_read_the_same(
    spark: Any, tmp_path: Path
) -> None:
    # The engine's sessions carry delta-spark's JARs (reconcile.spark.jars), so
    # native=None reads through it; the tests below take the file-list path,
    # which a session without them takes, by native=False.
    assert delta_jars_available(spark)
    uri = str(tmp_path / "t")
    write_delta(rows_of(spark, 0, 100), uri, app_id=APP, version=1, native=False)
    write_delta(rows_of(spark, 100, 50), uri, app_id=APP, version=2, native=False)
    for version in (1, 2, None):
        files = read_delta(spark, uri, version, native=False).orderBy("k").collect()
        assert read_delta(spark, uri, version).orderBy("k").collect() == files
        assert len(files) == (100 if version == 1 else 150)


def test_write_is_one_commit_with_token(spark: Any, tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    result = write_delta(rows_of(spark, 0, 1000), uri, app_id=APP, version=1, native=False)
    assert result.committed and result.rows == 1000 and result.files == 3
    table = DeltaTable(uri)
    assert table.transaction_version(APP) == 1
    # Version 0 creates the table, version 1 is the single commit holding every file.
    assert table.version() == 1 == result.table_version
    assert len(table.file_uris()) == 3
    (staging,) = staging_dirs(tmp_path / "t")
    assert all(p.startswith(f"{staging}/") for p in _paths(table))
    # Any Delta reader sees the rows; hashes agree across delta-rs + Python and Spark.
    arrow = pa.table(table.to_pyarrow_table()).sort_by("k")
    assert arrow.column("k").to_pylist() == list(range(1000))
    df = read_delta(spark, uri, native=False)
    cols = ["k", "name", "score", "ts"]
    spark_hashes = [
        r["h"]
        for r in df.select("k", row_hash_column(cols, df.schema).alias("h")).orderBy("k").collect()
    ]
    assert spark_hashes == row_hash_arrow(arrow, cols).to_pylist()


def _paths(table: DeltaTable) -> list[str]:
    return sorted(pa.table(table.get_add_actions(flatten=True)).column("path").to_pylist())


def test_replay_is_a_noop(spark: Any, tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    write_delta(rows_of(spark, 0, 100), uri, app_id=APP, version=3, native=False)
    log_before = committed_log_entries(tmp_path / "t")
    again = write_delta(rows_of(spark, 0, 100), uri, app_id=APP, version=3, native=False)
    older = write_delta(rows_of(spark, 0, 100), uri, app_id=APP, version=2, native=False)
    assert not again.committed and not older.committed
    assert committed_log_entries(tmp_path / "t") == log_before
    assert read_delta(spark, uri, native=False).count() == 100
    assert len(staging_dirs(tmp_path / "t")) == 1  # only the committed write's folder


def test_token_recorded_while_writing_discards_staged_files(spark: Any, tmp_path: Path) -> None:
    """A concurrent writer records the token between the file writes and our commit."""
    uri = str(tmp_path / "t")
    write_delta(rows_of(spark, 0, 10), uri, app_id=APP, version=1, native=False)
    table = DeltaTable(uri)
    schema = pa.schema(table.schema().to_arrow())

    def racer(files: Sequence[DataFile]) -> None:
        commit_files(DeltaCommit(table_uri=uri, schema=schema, app_id=APP, version=2))

    result = write_delta(
        rows_of(spark, 10, 10), uri, app_id=APP, version=2, before_commit=racer, native=False
    )
    assert not result.committed
    assert read_delta(spark, uri, native=False).count() == 10
    assert len(staging_dirs(tmp_path / "t")) == 1


def test_read_at_each_version_and_empty_table(spark: Any, tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    write_deltalake(
        uri, pa.table({"k": pa.array([], pa.int64()), "name": pa.array([], pa.string())})
    )
    empty = read_delta(spark, uri, native=False)
    assert empty.count() == 0 and empty.columns == ["k", "name"]
    for epoch in (1, 2, 3):
        df = spark.range(epoch * 10, epoch * 10 + epoch).selectExpr("id AS k", "'e' AS name")
        write_delta(df, uri, app_id=APP, version=epoch, native=False)
    assert DeltaTable(uri).version() == 3
    for version, keys in [(0, []), (1, [10]), (2, [10, 20, 21]), (3, [10, 20, 21, 30, 31, 32])]:
        got = read_delta(spark, uri, version=version, native=False).orderBy("k").collect()
        assert [r["k"] for r in got] == keys
    with pytest.raises(InvalidInputError):
        read_delta(spark, str(tmp_path / "missing"), native=False)


def test_partitioned_table_read_and_write(spark: Any, tmp_path: Path) -> None:
    uri = str(tmp_path / "p")
    seed = pa.table({"k": pa.array([1, 2, 3]), "part": pa.array(["a", "b", None])})
    write_deltalake(uri, seed, partition_by=["part"])
    df = spark.createDataFrame([(4, "a"), (5, "c")], "k long, part string")
    assert write_delta(df, uri, app_id=APP, version=1, native=False).committed
    got = read_delta(spark, uri, native=False)
    assert got.columns == ["k", "part"]
    assert sorted((r["k"], r["part"]) for r in got.collect()) == [
        (1, "a"),
        (2, "b"),
        (3, None),
        (4, "a"),
        (5, "c"),
    ]
    via_rust = pa.table(DeltaTable(uri).to_pyarrow_table()).sort_by("k")
    assert via_rust.column("part").to_pylist() == ["a", "b", None, "a", "c"]


def test_schema_mismatch_rejected_naming_column(spark: Any, tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    write_delta(rows_of(spark, 0, 10), uri, app_id=APP, version=1, native=False)
    log_before = committed_log_entries(tmp_path / "t")
    wrong = rows_of(spark, 10, 10).withColumn("score", F.col("k").cast("int"))
    with pytest.raises(InvalidInputError, match="'score'") as info:
        write_delta(wrong, uri, app_id=APP, version=2, native=False)
    assert "nothing was written" in str(info.value)
    extra = rows_of(spark, 10, 10).withColumn("surprise", F.col("k"))
    with pytest.raises(InvalidInputError, match="'surprise'"):
        write_delta(extra, uri, app_id=APP, version=2, native=False)
    assert committed_log_entries(tmp_path / "t") == log_before
    assert DeltaTable(uri).transaction_version(APP) == 1
    assert len(staging_dirs(tmp_path / "t")) == 1


CRASH_SCRIPT = textwrap.dedent(
    """
    import os, signal, sys
    from tests.fix_spark import build_local_session
    from expected_state.spark_bridge import write_delta

    spark = build_local_session("bridge-crash")
    df = spark.range(100, 200, numPartitions=2).selectExpr(
        "id AS k",
        "concat('name-', CAST(id AS STRING)) AS name",
        "id / 3.0D AS score",
        "timestamp_micros(id) AS ts",
    )

    def die(files):
        print("STAGED", len(files), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)  # after the file writes, before the commit

    write_delta(df, sys.argv[1], app_id="pipe/sink", version=2, before_commit=die, native=False)
    print("NOT REACHED", flush=True)
    """
)


@pytest.mark.timeout(600)  # a second Spark session, in the subprocess that crashes
def test_crash_before_commit_leaves_nothing_visible_and_vacuum_cleans(
    spark: Any, tmp_path: Path
) -> None:
    uri = str(tmp_path / "t")
    write_delta(rows_of(spark, 0, 100), uri, app_id=APP, version=1, native=False)
    version_before = DeltaTable(uri).version()
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYSPARK_PYTHON": sys.executable}
    proc = subprocess.run(
        [sys.executable, "-c", CRASH_SCRIPT, uri],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == -9, proc.stderr[-2000:]
    assert "STAGED 2" in proc.stdout and "NOT REACHED" not in proc.stdout
    # The crashed writer's files are on disk but in no commit.
    table = DeltaTable(uri)
    assert table.version() == version_before and table.transaction_version(APP) == 1
    assert len(staging_dirs(tmp_path / "t")) == 2
    assert read_delta(spark, uri, native=False).count() == 100
    assert pa.table(table.to_pyarrow_table()).num_rows == 100
    orphans = set(
        table.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=True, full=True)
    )
    live = set(_paths(table))
    assert orphans and not orphans & live
    table.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False, full=True)
    on_disk = {
        str(p.relative_to(tmp_path / "t"))
        for p in (tmp_path / "t").rglob("*")
        if p.is_file() and "_delta_log" not in p.parts
    }
    assert on_disk == live
    assert read_delta(spark, uri, native=False).count() == 100
    # The epoch the crash lost is simply written again.
    assert write_delta(rows_of(spark, 100, 100), uri, app_id=APP, version=2, native=False).committed
    assert read_delta(spark, uri, native=False).count() == 200
