"""Integration tests of the delta-spark sink on real Delta tables, on the shared Spark session.

Every check reads the table itself: with ``spark.read.format("delta")``, with
delta-rs, and the ``txn`` actions of its ``_delta_log``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from reconcile.core.contract import OK, Change, Fatal, FencedError, SinkTxnId
from sinks.delta_spark.apply import DELETE_COLUMN, apply_epoch
from sinks.delta_spark.sink import DeltaSparkSink
from sinks.registry import open_sink
from tests.fix_delta_spark import log_txns

pytestmark = pytest.mark.integration


def txn(epoch: int, generation: int = 0) -> SinkTxnId:
    return SinkTxnId("pipe", "out", epoch, generation)


def put(sink: DeltaSparkSink, t: SinkTxnId, rows: list[Any]) -> None:
    assert sink.stage(t, rows) == OK
    assert sink.prepare(t) == OK
    assert sink.commit(t) == OK


def spark_rows(spark: Any, uri: str) -> list[tuple[str, int, int]]:
    frame = spark.read.format("delta").load(uri)
    return sorted((r["k"], r["v"], r["_epoch"]) for r in frame.collect())


def rs_rows(uri: str) -> list[tuple[str, int, int]]:
    rows = DeltaTable(uri).to_pyarrow_table().to_pylist()
    return sorted((r["k"], r["v"], r["_epoch"]) for r in rows)


def test_upserts_and_deletes_by_key_read_back_by_spark_and_delta_rs(
    tmp_path: Path, spark: Any
) -> None:
    sink = open_sink("out", f"delta+spark://{tmp_path}?key=k")
    assert isinstance(sink, DeltaSparkSink) and sink.key == ("k",)
    put(sink, txn(1), [{"k": "a", "v": 1}, {"k": "b", "v": 2}, {"k": "c", "v": 3}])
    put(sink, txn(2), [Change("delete", {"k": "a"}), {"k": "b", "v": 20}, {"k": "d", "v": 4}])
    want = [("b", 20, 2), ("c", 3, 1), ("d", 4, 2)]
    assert spark_rows(spark, sink.uri) == want
    assert rs_rows(sink.uri) == want  # no duplicate key: MERGE, not append
    assert DeltaTable(sink.uri).transaction_version("pipe/out") == 2
    epochs = [v for app, v in log_txns(Path(sink.uri)) if app == "pipe/out"]
    assert epochs[-1] == 2 and epochs.count(2) == 1
    assert not list((Path(sink.uri) / "_txn_files").rglob("*.parquet"))  # stages dropped


@pytest.mark.parametrize("key", [("k",), ()], ids=["merge", "append"])
def test_a_replayed_commit_is_skipped_by_delta_itself(
    tmp_path: Path, spark: Any, key: tuple[str, ...]
) -> None:
    sink = DeltaSparkSink("out", tmp_path, key=key, spark=spark)
    put(sink, txn(1), [{"k": "a", "v": 1}])
    version = DeltaTable(sink.uri).version()
    # The same epoch's command again, with other rows, past every check of the
    # sink's own: only Delta's txnAppId/txnVersion stands in its way.
    replay = tmp_path / "replay.parquet"
    pq.write_table(
        pa.table({"k": ["a", "z"], "v": [99, 98], "_epoch": [1, 1], DELETE_COLUMN: [False] * 2}),
        replay,
    )
    apply_epoch(spark, sink.uri, [str(replay)], app_id="pipe/out", epoch=1,
                columns=["k", "v", "_epoch"], key=key, metadata={})  # fmt: skip
    assert DeltaTable(sink.uri).version() == version  # no commit at all
    assert spark_rows(spark, sink.uri) == [("a", 1, 1)]
    assert rs_rows(sink.uri) == [("a", 1, 1)]
    # The session confs of the MERGE are gone after it.
    assert spark.conf.get("spark.databricks.delta.write.txnAppId", None) is None


def test_a_zombie_of_an_older_generation_is_fenced_and_writes_nothing(
    tmp_path: Path, spark: Any
) -> None:
    zombie = DeltaSparkSink("out", tmp_path, key=("k",), spark=spark)
    put(zombie, txn(1), [{"k": "a", "v": 1}])
    assert zombie.stage(txn(2), [{"k": "a", "v": 666}]) == OK
    assert zombie.prepare(txn(2)) == OK
    taker = DeltaSparkSink("out", tmp_path, key=("k",), spark=spark)
    assert taker.stage(txn(3, 1), [{"k": "t", "v": 3}]) == OK
    assert taker.prepare(txn(3, 1)) == OK  # claims generation 1 in the log
    before = DeltaTable(zombie.uri).version()
    outcome = zombie.commit(txn(2))
    assert isinstance(outcome, Fatal) and isinstance(outcome.error, FencedError), outcome
    assert DeltaTable(zombie.uri).version() == before
    assert spark_rows(spark, zombie.uri) == [("a", 1, 1)]
    assert isinstance(zombie.prepare(txn(4)), Fatal)


def test_abort_drops_the_staged_file(tmp_path: Path, spark: Any) -> None:
    sink = DeltaSparkSink("out", tmp_path, key=("k",), spark=spark)
    t = txn(1)
    assert sink.stage(t, [{"k": "a", "v": 1}]) == OK and sink.prepare(t) == OK
    staged = Path(sink.uri) / "_txn_files"
    assert list(staged.rglob("*.parquet"))
    assert sink.abort(t) == OK
    assert not list(staged.rglob("*.parquet"))
    assert sink.recover() == []


def test_an_epoch_older_than_the_committed_one_is_refused_not_skipped(
    tmp_path: Path, spark: Any
) -> None:
    # Delta would skip it silently (its txnVersion is a high-water mark) and
    # the epoch would be lost: the sink refuses it, naming both epochs.
    sink = DeltaSparkSink("out", tmp_path, key=("k",), spark=spark)
    for epoch in (1, 2):
        assert sink.stage(txn(epoch), [{"k": f"e{epoch}", "v": epoch}]) == OK
        assert sink.prepare(txn(epoch)) == OK
    assert sink.commit(txn(2)) == OK
    before = DeltaTable(sink.uri).version()
    outcome = sink.commit(txn(1))
    assert isinstance(outcome, Fatal) and "older than committed epoch 2" in outcome.reason
    assert DeltaTable(sink.uri).version() == before
    assert spark_rows(spark, sink.uri) == [("e2", 2, 2)]
    assert sink.recover() == [txn(1)]  # still prepared: nothing was lost silently


def test_a_commit_into_a_table_gone_since_prepare_is_refused(tmp_path: Path) -> None:
    import shutil

    sink = DeltaSparkSink("out", tmp_path, key=("k",))
    assert sink.stage(txn(1), [{"k": "a", "v": 1}]) == OK and sink.prepare(txn(1)) == OK
    shutil.rmtree(Path(sink.uri) / "_delta_log")  # the claim's table is gone
    outcome = sink.commit(txn(1))
    assert isinstance(outcome, Fatal) and "is gone" in outcome.reason
    assert sink.recover() == [txn(1)]  # the prepared rows are kept


@pytest.mark.slow  # Spark commits and reads: over 10 s
def test_hand_drift_is_verified_and_repaired_and_spark_reads_the_expected_rows(
    tmp_path: Path, spark: Any
) -> None:
    from expected_state.store import ExpectedStateStore
    from reconcile import recover

    schema = pa.schema([("k", pa.string()), ("v", pa.int64())])
    store = ExpectedStateStore(str(tmp_path / "expected"), "pipe", "out", ["k"], schema=schema)
    sink = DeltaSparkSink("out", tmp_path / "lake", key=("k",), spark=spark)
    for epoch in (1, 2):
        rows = [{"k": f"{epoch}-{i}", "v": i} for i in range(5)]
        store.apply(epoch, [Change("upsert", r) for r in rows])
        put(sink, txn(epoch), rows)
    # By hand, with Spark's Delta: one row deleted, one changed, one added.
    spark.sql(f"DELETE FROM delta.`{sink.uri}` WHERE k = '2-1'")
    spark.sql(f"UPDATE delta.`{sink.uri}` SET v = 99 WHERE k = '1-3'")
    spark.sql(f"INSERT INTO delta.`{sink.uri}` VALUES ('x', 7, 2)")
    dsn = f"delta+spark://{tmp_path / 'lake'}?key=k"
    found = recover(dsn, str(tmp_path / "expected"), "pipe", "out", mode="full", dry_run=True)
    assert (found.missing, found.extra, found.changed) == (1, 1, 1), found
    before = DeltaTable(sink.uri).version()
    # Two of ten rows deleted or changed: past the brake's default share, lifted here.
    repaired = recover(dsn, str(tmp_path / "expected"), "pipe", "out", mode="full",
                       allow_mass_change=True)  # fmt: skip
    assert repaired.applied == 3
    assert DeltaTable(sink.uri).version() == before + 1  # one Delta commit
    frame = spark.read.format("delta").load(sink.uri)
    got = sorted((r["k"], r["v"]) for r in frame.collect())
    want = sorted((r["k"], r["v"]) for r in store.snapshot(columns=["k", "v"]).to_pylist())
    assert got == want and len(got) == 10
