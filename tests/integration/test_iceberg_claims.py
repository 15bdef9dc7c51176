"""What a co-writer of an Iceberg table can forge, on a real catalog (pyiceberg's SQL catalog).

Every forgery is made the way anyone with write access to the table would
make it: with pyiceberg, through a catalog client of its own. Each test then
shows that the next epoch writes its rows or stops loudly, naming what it
found, and never reports success with nothing written; assertions read the
table (its snapshots, properties and rows), not the engine's bookkeeping.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.catalog import load_catalog
from pyiceberg.table import Table

from expected_state.store import ExpectedStateStore
from reconcile import CommitCycle, CommitFatal, CommitSucceeded, recover
from reconcile.core.claims import Decided
from reconcile.core.contract import (
    Change,
    Fatal,
    ObjectTooLargeError,
    SinkTxnId,
    UntrustedRecordError,
    WriterIdentity,
)
from reconcile.core.metrics import InMemoryMetrics
from reconcile.engine.progress_file import FileProgressLog
from sinks.iceberg.sink import IcebergSink
from sinks.iceberg.tokens import BadPropertyError
from tests.fix_iceberg import catalog_uri

pytestmark = pytest.mark.integration

SCHEMA = pa.schema([("id", pa.int64()), ("qty", pa.int64())])


def sink_of(uri: str) -> IcebergSink:
    return IcebergSink("orders", f"{uri}&namespace=shop&key=id", schema=SCHEMA)


def co_writer(root: Path) -> Table:
    """The table as another writer sees it: pyiceberg, a catalog client of its own."""
    catalog = load_catalog("harness", type="sql", uri=f"sqlite:///{root}/catalog.db",
                           warehouse=f"file://{root}/warehouse")  # fmt: skip
    return catalog.load_table("shop.orders")


def forge(root: Path, summary: dict[str, str], properties: dict[str, str]) -> int:
    """Commit an empty snapshot with ``summary`` and set ``properties``, as a co-writer; its id."""
    table = co_writer(root)
    transaction = table.transaction()
    with transaction.update_snapshot(snapshot_properties=summary).fast_append():
        pass
    if properties:
        transaction.set_properties(properties)
    snapshot = transaction.commit_transaction().current_snapshot()
    assert snapshot is not None
    return snapshot.snapshot_id


def rows(epoch: int) -> list[dict[str, Any]]:
    return [{"id": epoch * 10 + i, "qty": epoch} for i in range(3)]


def run(uri: str, root: Path, epochs: range, metrics: InMemoryMetrics | None = None) -> list[Any]:
    """Run ``epochs`` through a commit cycle (its progress log under ``root``); the results."""
    cycle = CommitCycle("shop", [sink_of(uri)], root / "progress", metrics=metrics)
    cycle.start()
    try:
        return [cycle.run_epoch(e, {"orders": rows(e)}) for e in epochs]
    finally:
        cycle.close()


def table_rows(root: Path) -> list[tuple[int, int]]:
    data = co_writer(root).scan().to_arrow().sort_by("id")
    return list(zip(data.column("id").to_pylist(), data.column("_epoch").to_pylist(), strict=True))


def repair_summary(log_id: str, first: int, last: int, generation: int = 1) -> dict[str, str]:
    return {
        "reconcile.kind": "repair", "reconcile.pipeline": "shop", "reconcile.sink": "orders",
        "reconcile.first-epoch": str(first), "reconcile.epoch": str(last),
        "reconcile.generation": str(generation), "reconcile.log-id": log_id,
        "reconcile.txn": f"shop-orders-{last}-g{generation}",
    }  # fmt: skip


def test_a_forged_repair_claiming_a_million_epochs_stops_the_next_epoch_loudly(
    tmp_path: Path,
) -> None:
    uri = catalog_uri(tmp_path)
    assert all(isinstance(r, CommitSucceeded) for r in run(uri, tmp_path, range(3)))
    log_id = FileProgressLog(tmp_path / "progress", "shop").log_id
    # The co-writer copies the log id from a real snapshot's summary, and says
    # that epochs 1 to 1,000,000 are in (the newest-epoch mark too).
    forged = forge(tmp_path, repair_summary(log_id, 1, 1_000_000),
                   {"reconcile.shop.orders.epoch": "1000000"})  # fmt: skip
    before = table_rows(tmp_path)
    for attempt in range(2):  # and again after a restart: the record is still there
        metrics = InMemoryMetrics()
        [result] = run(uri, tmp_path, range(3, 4), metrics)
        assert isinstance(result, CommitFatal) and not result.restart, (attempt, result)
        assert isinstance(result.error, UntrustedRecordError)
        assert "orders" in result.reason and "1000000" in result.reason
        assert "epochs up to 2" in result.reason  # what the store decided
        assert metrics.value("sink.untrusted_record", sink="orders") >= 1
    # Nothing of epoch 3 is in the table, and its history ends with the forgery.
    assert table_rows(tmp_path) == before
    assert co_writer(tmp_path).metadata.current_snapshot_id == forged


@pytest.mark.parametrize(
    ("first", "last", "generation", "claims"),
    [(1, 1_000_000, 1, "epochs 1 to 1000000"), (2, 2, 7, "writer generation 7")],
    ids=["undecided_epochs", "newer_generation"],
)
def test_a_forged_snapshot_within_the_mark_is_refused_by_what_it_claims(
    first: int, last: int, generation: int, claims: str, tmp_path: Path
) -> None:
    # The newest-epoch mark is left where it is: the snapshot alone claims too
    # much (epochs never decided, or a generation never granted). A writer
    # committing epoch 2 again (its reply was lost) meets it first.
    uri = catalog_uri(tmp_path)
    run(uri, tmp_path, range(3))
    log_id = FileProgressLog(tmp_path / "progress", "shop").log_id
    forged = forge(tmp_path, repair_summary(log_id, first, last, generation), {})
    writer = sink_of(uri)
    writer.bind(WriterIdentity("shop", log_id, decisions=Decided(epoch=2, generation=1)))
    outcome = writer.commit(SinkTxnId("shop", "orders", 2, 1))
    assert isinstance(outcome, Fatal) and isinstance(outcome.error, UntrustedRecordError)
    assert f"snapshot {forged}" in outcome.reason and claims in outcome.reason
    assert outcome.error.details["sink"] == "orders"
    assert co_writer(tmp_path).metadata.current_snapshot_id == forged  # nothing written


@pytest.mark.parametrize(
    ("name", "value", "kind"),
    [("epoch", "1000000", "newest epoch"), ("generation", "99", "fence")],
    ids=["newest_epoch", "fence"],
)
def test_a_forged_property_is_refused_not_obeyed(
    name: str, value: str, kind: str, tmp_path: Path
) -> None:
    # Only the table property: no snapshot claims anything. A newest epoch of
    # a million would have the epoch refused as "older than the newest"; a
    # fence of 99 would have the writer fenced off: both are refused as
    # untrusted records instead, naming the property.
    uri = catalog_uri(tmp_path)
    run(uri, tmp_path, range(3))
    prop = f"reconcile.shop.orders.{name}"
    co_writer(tmp_path).transaction().set_properties({prop: value}).commit_transaction()
    snapshots = len(co_writer(tmp_path).snapshots())
    metrics = InMemoryMetrics()
    [result] = run(uri, tmp_path, range(3, 4), metrics)
    assert isinstance(result, CommitFatal) and isinstance(result.error, UntrustedRecordError)
    assert prop in result.reason and value in result.reason, result.reason
    assert metrics.value("sink.untrusted_record", sink="orders", kind=kind) >= 1
    assert len(co_writer(tmp_path).snapshots()) == snapshots  # nothing written


def test_every_epoch_a_repair_stands_for_replays_as_a_no_op_its_first_and_last_included(
    tmp_path: Path,
) -> None:
    uri = catalog_uri(tmp_path)
    run(uri, tmp_path, range(1))
    # The store runs on to epoch 3 while the sink misses epochs 1 to 3; a repair
    # brings it there, standing for epochs 1 to 3.
    store = ExpectedStateStore(str(tmp_path / "store"), "shop", "orders", ["id"], schema=SCHEMA)
    for e in range(4):
        store.apply(e, [Change("upsert", r) for r in rows(e)])
    report = recover(f"{uri}&namespace=shop", str(tmp_path / "store"), "shop", "orders",
                     mode="full", max_change_fraction=1.0)  # fmt: skip
    assert report.applied == 9
    table = co_writer(tmp_path)
    summary: Any = table.current_snapshot().summary  # type: ignore[union-attr]
    assert (summary["reconcile.kind"], summary["reconcile.first-epoch"],
            summary["reconcile.epoch"]) == ("repair", "1", "3")  # fmt: skip
    snapshots, repaired = len(table.snapshots()), table_rows(tmp_path)
    log_id = FileProgressLog(tmp_path / "progress", "shop").log_id
    for epoch in (1, 2, 3):
        # A replay of the epoch with other rows (a recomputation): nothing is written.
        replay = sink_of(uri)
        replay.bind(WriterIdentity("shop", log_id, decisions=Decided(epoch=3, generation=1)))
        txn = SinkTxnId("shop", "orders", epoch, 1)
        assert replay.stage(txn, [{"id": 500 + epoch, "qty": -1}])
        assert replay.prepare(txn) and replay.commit(txn), epoch
        assert len(co_writer(tmp_path).snapshots()) == snapshots, epoch
    assert table_rows(tmp_path) == repaired


def test_a_garbage_generation_property_is_named_and_stops_the_pipeline(tmp_path: Path) -> None:
    uri = catalog_uri(tmp_path)
    run(uri, tmp_path, range(2))
    table = co_writer(tmp_path)
    garbage = {"reconcile.shop.orders.generation": "one"}
    table.transaction().set_properties(garbage).commit_transaction()
    [result] = run(uri, tmp_path, range(2, 3))
    assert isinstance(result, CommitFatal) and not result.restart, result
    assert isinstance(result.error, BadPropertyError)
    for named in ("shop.orders", "reconcile.shop.orders.generation", "'one'"):
        assert named in result.reason, named
    assert [e for _, e in table_rows(tmp_path)] == [0, 0, 0, 1, 1, 1]  # nothing of epoch 2


def test_a_huge_metadata_file_is_refused_unread_naming_it_and_its_size(tmp_path: Path) -> None:
    uri = catalog_uri(tmp_path)
    run(uri, tmp_path, range(1))
    # A co-writer's snapshot summary of 2 MB; the bound set (as a catalog
    # property) to 1 MB for the test: the engine's default is 64 MiB.
    forge(tmp_path, {"note": "x" * (2 << 20)}, {})
    bounded = f"{uri}&reconcile.max-metadata-bytes={1 << 20}"
    sink = sink_of(bounded)
    txn = SinkTxnId("shop", "orders", 1, 1)
    assert sink.stage(txn, rows(1))
    outcome = sink.prepare(txn)
    assert isinstance(outcome, Fatal) and isinstance(outcome.error, ObjectTooLargeError)
    size = outcome.error.details["size"]
    assert size > 2 << 20 and str(size) in outcome.reason and ".metadata.json" in outcome.reason
    with pytest.raises(ObjectTooLargeError):
        CommitCycle("shop", [sink_of(bounded)], tmp_path / "progress").start()
    # Under the default bound the same table is read, and the epoch goes in.
    assert all(isinstance(r, CommitSucceeded) for r in run(uri, tmp_path, range(1, 2)))
