"""What a co-tenant with write access to the bucket can forge in the S3 sink's log, on moto's S3.

Each forgery is made the way anyone who can write the bucket would make it:
objects put with boto3, the log's next entry included. Each test then shows
that the next epoch writes its rows or stops loudly naming what it found,
never reports success with nothing written; assertions read the bucket (the
log's entries), not the engine's bookkeeping.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import boto3
import pyarrow as pa
import pytest

from reconcile import CommitCycle, CommitFatal, CommitSucceeded, recover
from reconcile.core.claims import Decided
from reconcile.core.contract import (
    Fatal,
    ObjectTooLargeError,
    SinkTxnId,
    UntrustedRecordError,
    WriterIdentity,
)
from reconcile.core.metrics import InMemoryMetrics
from reconcile.core.target import Repair
from reconcile.engine.expected import ExpectedState
from sinks.s3.log import MAX_ENTRY_BYTES
from sinks.s3.sink import open_uri, pullable_sink
from tests.fix_s3 import S3Endpoint

pytestmark = pytest.mark.integration

LOG = "sinks/orders/log/"


@pytest.fixture
def uri(s3_endpoint: S3Endpoint, s3_bucket: str) -> str:
    return f"s3://{s3_bucket}/sinks"


def rows(epoch: int) -> list[dict[str, Any]]:
    return [{"id": epoch * 10 + i, "qty": epoch} for i in range(3)]


def run(uri: str, store: Path, epochs: range, metrics: InMemoryMetrics | None = None) -> list[Any]:
    """Run ``epochs`` through a cycle whose progress log is the store's; the results."""
    expected = ExpectedState(str(store), "shop", {"orders": ["id"]})
    cycle = CommitCycle("shop", [open_uri("orders", uri)], expected_state=expected,
                        metrics=metrics)  # fmt: skip
    cycle.start()
    try:
        return [cycle.run_epoch(e, {"orders": rows(e)}) for e in epochs]
    finally:
        cycle.close()


def entries(bucket: str) -> list[dict[str, Any]]:
    s3 = boto3.client("s3")
    listed = s3.list_objects_v2(Bucket=bucket, Prefix=LOG).get("Contents", [])
    return [json.loads(s3.get_object(Bucket=bucket, Key=o["Key"])["Body"].read())
            for o in sorted(listed, key=lambda o: o["Key"])]  # fmt: skip


def put_entry(bucket: str, entry: dict[str, Any] | bytes) -> str:
    """The log's next entry, put as a co-tenant would (plain PutObject); its key."""
    key = f"{LOG}{len(entries(bucket)):020d}.json"
    body = entry if isinstance(entry, bytes) else json.dumps(entry).encode()
    boto3.client("s3").put_object(Bucket=bucket, Key=key, Body=body)
    return key


def forged_repair(log_id: str, first: int, last: int) -> dict[str, Any]:
    return {"kind": "repair", "pipeline": "shop", "sink": "orders", "first_epoch": first,
            "epoch": last, "log_id": log_id, "batch": "repairs/forged.batch",
            "repair_id": "forged"}  # fmt: skip


def test_a_forged_repair_entry_claiming_a_million_epochs_stops_the_next_epoch_loudly(
    uri: str, s3_bucket: str, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    assert all(isinstance(r, CommitSucceeded) for r in run(uri, store, range(3)))
    log_id = entries(s3_bucket)[-1]["log_id"]  # copied from a real entry
    key = put_entry(s3_bucket, forged_repair(log_id, 1, 1_000_000))
    count = len(entries(s3_bucket))
    for attempt in range(2):  # and again after a restart: the entry is still there
        metrics = InMemoryMetrics()
        [result] = run(uri, store, range(3, 4), metrics)
        assert isinstance(result, CommitFatal) and not result.restart, (attempt, result)
        assert isinstance(result.error, UntrustedRecordError)
        assert key in result.reason and "epochs 1 to 1000000" in result.reason
        assert "epochs up to 2" in result.reason
        assert metrics.value("sink.untrusted_record", sink="orders", kind="repair") >= 1
        # Nothing of epoch 3: at most the new writer's fence entry follows.
        assert {e["kind"] for e in entries(s3_bucket)[count:]} <= {"fence"}
    # A verify refuses it too: the sink claims epochs the store never decided.
    with pytest.raises(UntrustedRecordError, match="1000000"):
        recover(uri, str(store), "shop", "orders", keys=["id"], dry_run=True)


def test_a_forged_fence_is_refused_not_obeyed(uri: str, s3_bucket: str, tmp_path: Path) -> None:
    store = tmp_path / "store"
    run(uri, store, range(2))
    log_id = entries(s3_bucket)[-1]["log_id"]
    put_entry(s3_bucket, {"kind": "fence", "pipeline": "shop", "generation": 99,
                          "log_id": log_id})  # fmt: skip
    [result] = run(uri, store, range(2, 3))
    assert isinstance(result, CommitFatal) and isinstance(result.error, UntrustedRecordError)
    assert "writer generation 99" in result.reason and "fence" in result.reason
    assert [e["kind"] for e in entries(s3_bucket)][-1] == "fence"  # nothing after it


def test_every_epoch_a_repair_stands_for_replays_as_a_no_op_its_first_and_last_included(
    uri: str, s3_bucket: str, tmp_path: Path
) -> None:
    run(uri, tmp_path / "store", range(1))
    log_id = entries(s3_bucket)[-1]["log_id"]
    sink = pullable_sink(uri, "orders", name="orders", key=["id"])
    sink.bind(WriterIdentity("shop", log_id))
    fence = sink.log.refresh().fences.generation("shop").generation
    schema = pa.schema([("id", pa.int64()), ("qty", pa.int64())])
    target = sink.recovery_target("shop", fence, write=True)
    with target.snapshot(schema, ["id"]) as snap:
        seen = snap.newest_epoch
    upserts = pa.table({"id": [30], "qty": [3]}, schema=schema)
    assert target.apply(Repair(upserts, pa.table({"id": pa.array([], pa.int64())}), 3, seen)) == 1
    repair = entries(s3_bucket)[-1]
    assert (repair["kind"], repair["first_epoch"], repair["epoch"]) == ("repair", 1, 3)
    count = len(entries(s3_bucket))
    for epoch in (1, 2, 3):
        replay = open_uri("orders", uri)
        replay.bind(WriterIdentity("shop", log_id, decisions=Decided(epoch=3, generation=fence)))
        txn = SinkTxnId("shop", "orders", epoch, fence)
        assert replay.stage(txn, rows(epoch)) and replay.prepare(txn) and replay.commit(txn)
        assert len(entries(s3_bucket)) == count, epoch  # nothing appended


def test_the_log_is_never_read_past_a_removed_entry(
    uri: str, s3_bucket: str, tmp_path: Path
) -> None:
    run(uri, tmp_path / "store", range(3))
    kinds = [e["kind"] for e in entries(s3_bucket)]
    assert kinds == ["fence", "commit", "commit", "commit"]
    # Epoch 1's commit entry removed by hand: read past it, epoch 1 would look
    # uncommitted and a replay of it would be appended again.
    boto3.client("s3").delete_object(Bucket=s3_bucket, Key=f"{LOG}{2:020d}.json")
    sink = open_uri("orders", uri)
    sink.bind(WriterIdentity("shop", entries(s3_bucket)[-1]["log_id"]))
    txn = SinkTxnId("shop", "orders", 1, 1)
    assert sink.stage(txn, rows(1))
    outcome = sink.prepare(txn)
    assert isinstance(outcome, Fatal) and "skips from entry 1 to 3" in outcome.reason, outcome
    assert not sink.commit(txn)
    assert len(entries(s3_bucket)) == 3  # nothing appended


def test_a_huge_log_entry_is_refused_unread_naming_it_and_its_size(
    uri: str, s3_bucket: str, tmp_path: Path
) -> None:
    run(uri, tmp_path / "store", range(1))
    log_id = entries(s3_bucket)[-1]["log_id"]
    # A well-formed commit entry of the next epoch, padded past the bound.
    huge = {"kind": "commit", "pipeline": "shop", "sink": "orders", "epoch": 1, "rows": 0,
            "txn": "shop-orders-1-g1", "log_id": log_id, "batch": "batches/x.batch",
            "pad": "x" * MAX_ENTRY_BYTES}  # fmt: skip
    key = put_entry(s3_bucket, huge)
    sink = open_uri("orders", uri)
    sink.bind(WriterIdentity("shop", log_id, decisions=Decided(epoch=0, generation=1)))
    txn = SinkTxnId("shop", "orders", 1, 1)
    assert sink.stage(txn, rows(1))
    outcome = sink.prepare(txn)
    assert isinstance(outcome, Fatal) and isinstance(outcome.error, ObjectTooLargeError), outcome
    size = outcome.error.details["size"]
    assert size > MAX_ENTRY_BYTES and key in outcome.reason and str(size) in outcome.reason
