"""Spark's own Delta reader (delta-spark) reads every store table exactly as the engine does.

The store is written through the engine's real paths: epochs through a
CommitCycle into PostgreSQL with an expected state, a merge of change files
and a fold into the base, the store's housekeeping (``maintain``: merge,
vacuum, checkpoint, log pruning), a column added by an epoch, a repair through
``recover()``. After each step every Delta table under the store's root is read
with ``spark.read.format("delta")`` (the delta-spark JARs on the tests' shared
session), at the newest version and with ``versionAsOf`` at older ones, and its
rows must be exactly those delta-rs (``deltalake``, the engine's own reader)
returns for that version; a state table's rows, merged by the store's rule, must
be ``snapshot()`` of the epoch that version recorded. The protocol Spark reports
(DESCRIBE DETAIL) must be the one in the log and one the store promises
(docs/expected_state.md: reader 1, writer 2, no table features of its own; with a
timestamp without a zone, reader 3, writer 7 and ``timestampNtz`` with ``invariants``).

The default tier reads the newest version and one older one after each step;
the slow sweep reads every version the log still holds, and every epoch.
"""

from __future__ import annotations

import datetime as dt
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
import pytest
from deltalake import DeltaTable

from expected_state.evolved_files import has_added_columns
from expected_state.merge import resolve
from expected_state.protocol import has_naive_timestamp
from expected_state.store import ExpectedStateStore
from reconcile import CommitCycle, CommitSucceeded
from reconcile.core.contract import Change
from reconcile.core.hashing import row_hash_arrow
from reconcile.engine.expected import ExpectedState
from reconcile.recovery import recover
from reconcile.spark.jars import DELTA_GROUP, S3_GROUP, require, s3a_settings
from sinks.postgres.factory import postgres_sink

pytestmark = [pytest.mark.integration]

KEYS = ["id"]
DDL = "CREATE TABLE orders (id bigint PRIMARY KEY, qty bigint, name text, _epoch bigint)"
# The protocol the store promises every Delta reader (docs/expected_state.md): reader 1,
# writer 2, and so no table features beyond the two writer 2 implies.
READER, WRITER, FEATURES = 1, 2, {"appendOnly", "invariants"}
# ... unless a column is a timestamp without a zone: reader 3, writer 7, these features.
NTZ_FEATURES = {"timestampNtz", "invariants"}


def _plain(value: Any) -> Any:
    # Spark hands a timestamp back naive in the session's zone (UTC); delta-rs aware.
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return value.astimezone(dt.UTC).replace(tzinfo=None)
    return value


def _sorted(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    return sorted((tuple(_plain(v) for v in r) for r in rows), key=repr)


def store_tables(root: Path) -> list[Path]:
    """Every Delta table under the store's root (the state tables and ``_epochs``)."""
    return sorted(p.parent for p in root.rglob("_delta_log") if p.is_dir())


def log_versions(uri: Path) -> list[int]:
    """The versions the table's log still holds whole: from its oldest checkpoint on, once
    the log was pruned (the commits before it are gone), else from version 0."""
    log = uri / "_delta_log"
    commits = sorted(int(p.name.split(".")[0]) for p in log.glob("*.json"))
    checkpoints = sorted(int(p.name.split(".")[0]) for p in log.glob("*.checkpoint*.parquet"))
    start = 0 if commits and commits[0] == 0 else min(checkpoints)
    return [v for v in range(start, commits[-1] + 1)]


def engine_rows(uri: Path | str, version: int) -> tuple[list[str], list[tuple[Any, ...]]] | None:
    """The rows delta-rs reads at ``version``; None when it cannot (a vacuumed file)."""
    try:
        table = DeltaTable(str(uri), version=version).to_pyarrow_table()
    except Exception:  # the engine's own reader cannot read it: nothing to compare
        return None
    return table.column_names, _rows(table, table.column_names)


def _rows(table: pa.Table, names: list[str]) -> list[tuple[Any, ...]]:
    return _sorted([tuple(r[n] for n in names) for r in table.to_pylist()])


def spark_table(spark: Any, uri: Path | str, version: int | None) -> pa.Table:
    """The rows delta-spark reads at ``version`` (time travel; None: the newest), as Arrow."""
    reader = spark.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", version)
    return reader.load(str(uri)).toArrow()


def check_protocol(spark: Any, uri: Path | str) -> None:
    """Spark's DESCRIBE DETAIL shows the log's protocol, and it is the one the store promises."""
    detail = spark.sql(f"DESCRIBE DETAIL delta.`{uri}`").collect()[0]
    protocol = DeltaTable(str(uri)).protocol()
    got = (detail.minReaderVersion, detail.minWriterVersion, set(detail.tableFeatures or []))
    assert got[:2] == (protocol.min_reader_version, protocol.min_writer_version), uri
    schema = pa.schema(DeltaTable(str(uri)).schema().to_arrow())
    if not any(has_naive_timestamp(f.type) for f in schema):
        assert got[0] == READER and got[1] == WRITER and got[2] <= FEATURES, (uri, got)
        return
    # A timestamp without a zone needs table features; `invariants` is listed with it.
    assert got[:2] == (3, 7) and NTZ_FEATURES <= got[2] <= NTZ_FEATURES | FEATURES, (uri, got)


def check_state(rows: pa.Table, store: ExpectedStateStore, version: int) -> None:
    """A state table's rows at ``version``, merged by the store's rule, are the snapshot of
    the epoch that version holds (a compaction or housekeeping commit changes no state).

    ``_row_hash`` is compared recomputed over the table's columns: a row written before a
    column was added keeps, in its file, the hash over the columns of its day, which the
    store's own reader recomputes (expected_state/evolved_files.py) and a plain reader does
    not. Until a column is added the stored hash is compared as it is.
    """
    known = {e: v for e, v in store.epoch_versions().items() if v <= version}
    if not known:  # the epochs of that version were forgotten with the pruned log
        return
    expected = store.snapshot(max(known))
    state = resolve(rows, KEYS)
    # A version from before a column was added has no such column for a plain reader;
    # the store reads its rows with the column NULL.
    for field in expected.schema:
        if field.name not in state.column_names:
            state = state.append_column(field.name, pa.nulls(state.num_rows, field.type))
    state = state.select(expected.column_names).cast(expected.schema)
    user = list(store.user_schema.names) if store.user_schema is not None else []
    names = [n for n in expected.column_names if n != "_row_hash"]
    assert _rows(state, names) == _rows(expected, names), version
    evolved = has_added_columns(pa.schema(DeltaTable(store.uri).schema().to_arrow()))
    stored = (
        state
        if not evolved
        else state.set_column(
            state.column_names.index("_row_hash"), "_row_hash", row_hash_arrow(state, user)
        )
    )
    assert _rows(stored, ["id", "_row_hash"]) == _rows(expected, ["id", "_row_hash"]), version


def check_version(
    spark: Any,
    uri: Path | str,
    version: int,
    store: ExpectedStateStore | None = None,
    *,
    newest: bool = False,
) -> bool:
    """Spark's rows of ``version`` are delta-rs'; False when delta-rs cannot read it.

    ``newest``: ``version`` is the newest, and Spark reads the table as it is, without
    ``versionAsOf`` (nothing writes meanwhile: the callers wait for the housekeeping).
    """
    read = engine_rows(uri, version)
    if read is None:
        return False
    names, rows = read
    table = spark_table(spark, uri, None if newest else version)
    assert _rows(table, names) == rows, (uri, version)
    if store is not None and str(store.uri).rstrip("/") == str(uri).rstrip("/"):
        check_state(table, store, version)
    return True


def check_store(spark: Any, root: Path, store: ExpectedStateStore, *, every: bool) -> None:
    """Every store table read by Spark as by the engine.

    ``every``: each table's protocol, every version a state table's log holds, and a
    spread of about five of ``_epochs``' (three commits an epoch, which nobody reads at
    an old version). Else the state table's protocol and newest version only (the
    default tier's check between steps).
    """
    if not every:
        uri = Path(store.uri)
        check_protocol(spark, uri)
        assert check_version(spark, uri, log_versions(uri)[-1], store, newest=True), uri
        return
    tables = store_tables(root)
    assert Path(store.uri) in tables and root / "_epochs" in tables, tables
    for uri in tables:
        check_protocol(spark, uri)
        versions = log_versions(uri)
        if uri == root / "_epochs":
            versions = sorted({*versions[:: max(1, len(versions) // 5)], versions[-1]})
        compared = [v for v in versions if check_version(spark, uri, v, store)]
        assert versions[-1] in compared and len(compared) >= min(2, len(versions)), uri


def check_newest_and_older(spark: Any, root: Path, store: ExpectedStateStore) -> None:
    """Each table's protocol, its newest version and the newest older one delta-rs reads."""
    tables = store_tables(root)
    assert Path(store.uri) in tables and root / "_epochs" in tables, tables
    for uri in tables:
        check_protocol(spark, uri)
        newest, *older = reversed(log_versions(uri))
        assert check_version(spark, uri, newest, store, newest=True), uri
        # Older than the table's deletedFileRetentionDuration (minutes), as an epoch a
        # verify reads usually is: delta-spark dates a commit by its file's time.
        aged = time.time() - 3 * 3600
        for commit in (uri / "_delta_log").glob("*.json"):
            if int(commit.name.split(".")[0]) < newest:
                os.utime(commit, (aged, aged))
        assert any(check_version(spark, uri, v, store) for v in older), f"{uri}: no older version"


def _row(i: int, epoch: int, **extra: Any) -> dict[str, Any]:
    return {"id": i, "qty": i * 10 + epoch, "name": f"n{i}-{epoch}", **extra}


def _epoch(epoch: int) -> list[Any]:
    """Some new keys, some changed, one deleted: every kind of change in every epoch."""
    rows: list[Any] = [_row(i, epoch) for i in range(epoch * 3, epoch * 3 + 5)]
    if epoch:
        rows.append(Change("delete", {"id": epoch * 3 - 2}))
    return rows


class Pipeline:
    """The engine's own cycle over a PostgreSQL sink with an expected state under ``root``."""

    def __init__(self, dsn: str, root: Path | str) -> None:
        self.dsn, self.root = dsn, root
        self.expected = ExpectedState(str(root), "shop", {"orders": KEYS})
        self.cycle = CommitCycle("shop", [postgres_sink(dsn, "orders", name="orders")],
                                 expected_state=self.expected)  # fmt: skip
        self.cycle.start()

    def run(self, epochs: range, **extra: Any) -> None:
        for epoch in epochs:
            rows = [r if isinstance(r, Change) else {**r, **extra} for r in _epoch(epoch)]
            assert isinstance(self.cycle.run_epoch(epoch, {"orders": rows}), CommitSucceeded)

    @property
    def store(self) -> ExpectedStateStore:
        return self.expected.tables["orders"]


@pytest.fixture
def pipeline(pg_db: str, tmp_path: Path) -> Iterator[Pipeline]:
    require(DELTA_GROUP, "the delta-spark interop test")  # fails, naming fetch-jars
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute(DDL)
    running = Pipeline(pg_db, tmp_path / "store")
    yield running
    running.cycle.close()


def _sink_ids(dsn: str) -> list[int]:
    with psycopg.connect(dsn) as conn:
        return [r[0] for r in conn.execute("SELECT id FROM orders ORDER BY id").fetchall()]


def walk(spark: Any, p: Pipeline, *, every: bool, epochs: int) -> list[str]:
    """Each step of the engine's writes, the store read by Spark after each; the steps run."""
    steps = []
    root, store = p.root, p.store
    p.run(range(epochs))
    check_store(spark, root, p.store, every=every)
    steps.append("epochs")

    # Through p.store: it waits for the housekeeping the cycle runs in the background.
    merged = p.store.compact_changes()
    folded = p.store.compact()
    assert merged is not None and folded is not None
    assert any(f.kind == "base" for f in store.files_at(None) or []), "nothing folded"
    check_store(spark, root, p.store, every=every)
    steps.append("compaction")

    # Twice: the first run's checkpoint is what the second run's vacuum prunes the log to.
    for turn in (1, 2):
        p.run(range(turn * epochs, (turn + 1) * epochs))
        done = p.store.maintain(compact_changes_after=2, checkpoint_every=2, keep_epochs=2,
                                retention_hours=0, safety_margin_minutes=0)  # fmt: skip
        # The housekeeping ran what this step is about: a merge, a vacuum, a checkpoint.
        assert {"compact_changes", "vacuum", "checkpoint"} <= set(done), done
        assert done["vacuum"].deleted_files, "the vacuum deleted nothing"
    assert log_versions(Path(store.uri))[0] > 0, "the log was not pruned"
    check_store(spark, root, p.store, every=every)
    steps.append("housekeeping")

    # Columns added by an epoch; a timestamp without a zone raises the table's protocol.
    at = dt.datetime(2026, 11, 29, 8, 30, 0, 123456)
    p.run(range(3 * epochs, 3 * epochs + 2), note="new", at=at)
    names = pa.schema(DeltaTable(store.uri).schema().to_arrow()).names
    assert "note" in names and "at" in names, names
    check_store(spark, root, p.store, every=every)
    steps.append("evolution")

    with psycopg.connect(p.dsn, autocommit=True) as conn:
        conn.execute("DELETE FROM orders WHERE id IN (SELECT min(id) FROM orders)")
        conn.execute("INSERT INTO orders (id, qty, name) VALUES (100000, 1, 'hand')")
    report = recover(p.dsn, str(root), "shop", "orders", mode="full")
    assert (report.missing, report.extra, report.applied) == (1, 1, 2), report
    assert _sink_ids(p.dsn) == sorted(p.store.snapshot().column("id").to_pylist())
    p.run(range(3 * epochs + 2, 3 * epochs + 3), note="after", at=at)  # the cycle goes on after it
    check_store(spark, root, p.store, every=every)
    check_newest_and_older(spark, root, p.store)
    steps.append("repair")
    return steps


def test_spark_reads_every_store_table_as_the_engine_does(spark: Any, pipeline: Pipeline) -> None:
    steps = walk(spark, pipeline, every=False, epochs=3)
    assert steps == ["epochs", "compaction", "housekeeping", "evolution", "repair"]


@pytest.mark.slow
@pytest.mark.timeout(1200)  # about a hundred Spark time-travel reads, each a log replay
def test_spark_reads_every_version_and_every_epoch_as_the_engine_does(
    spark: Any, pipeline: Pipeline
) -> None:
    steps = walk(spark, pipeline, every=True, epochs=3)
    assert steps == ["epochs", "compaction", "housekeeping", "evolution", "repair"]


@pytest.fixture
def s3_pipeline(spark: Any, pg_db: str, s3_bucket: str) -> Iterator[Pipeline]:
    """The pipeline with its store on S3 (moto), and Spark's S3A pointed at the same endpoint."""
    require(DELTA_GROUP, "the delta-spark interop test")
    require(S3_GROUP, "the delta-spark interop test on S3")
    # The tests' shared session started before the endpoint did: the settings the
    # engine's sessions take from the environment at start are set on it now.
    # Its JVM's environment predates the endpoint's variables too, so moto's test keys
    # are given as settings here (a session started after them reads them itself).
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    keys = {"fs.s3a.access.key": os.environ["AWS_ACCESS_KEY_ID"],
            "fs.s3a.secret.key": os.environ["AWS_SECRET_ACCESS_KEY"]}  # fmt: skip
    for key, value in {**s3a_settings(os.environ), **keys}.items():
        hadoop.set(key, value)
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute(DDL)
    running = Pipeline(pg_db, f"s3://{s3_bucket}/store")
    yield running
    running.cycle.close()


def check_on_s3(spark: Any, store: ExpectedStateStore, epochs: str) -> None:
    """Both tables' protocol, their newest version, and the newest older one delta-rs reads."""
    for uri in (store.uri, epochs):
        check_protocol(spark, uri)
        newest = DeltaTable(uri).version()
        assert check_version(spark, uri, newest, store, newest=True), uri
        older = (v for v in range(newest - 1, -1, -1) if engine_rows(uri, v) is not None)
        assert check_version(spark, uri, next(older), store), f"{uri}: no older version"


@pytest.mark.slow
@pytest.mark.timeout(900)  # Spark's S3A client against moto, a few reads after each step
def test_spark_reads_a_store_on_s3_as_the_engine_does(spark: Any, s3_pipeline: Pipeline) -> None:
    p = s3_pipeline
    root = str(p.root)
    assert root.startswith("s3://"), root
    epochs = f"{root}/_epochs"
    p.run(range(3))
    check_on_s3(spark, p.store, epochs)
    assert p.store.compact_changes() is not None and p.store.compact() is not None
    p.run(range(3, 6))
    done = p.store.maintain(compact_changes_after=2, checkpoint_every=2, keep_epochs=2,
                            retention_hours=0, safety_margin_minutes=0)  # fmt: skip
    assert {"compact_changes", "vacuum", "checkpoint"} <= set(done), done
    assert done["vacuum"].deleted_files, "the vacuum deleted nothing on S3"
    check_on_s3(spark, p.store, epochs)
    at = dt.datetime(2026, 11, 29, 8, 30, 0, 123456)
    p.run(range(6, 8), note="new", at=at)  # columns added, one needs table features
    with psycopg.connect(p.dsn, autocommit=True) as conn:
        conn.execute("DELETE FROM orders WHERE id IN (SELECT min(id) FROM orders)")
    report = recover(p.dsn, root, "shop", "orders", mode="full")
    assert (report.missing, report.extra, report.applied) == (1, 0, 1), report
    p.run(range(8, 9), note="after", at=at)
    check_on_s3(spark, p.store, epochs)
    assert _sink_ids(p.dsn) == sorted(p.store.snapshot().column("id").to_pylist())
