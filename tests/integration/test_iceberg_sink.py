"""The Iceberg sink on a real catalog (pyiceberg's SQL catalog on SQLite) and a local warehouse.

One snapshot per epoch that a replay finds; a zombie fenced by the catalog's
commit requirements; upserts and deletes by key in one snapshot; bad rows
refused by name; pull-and-diff through ``recover``.
"""

from __future__ import annotations

import datetime as dt
import decimal
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.expressions import EqualTo, In
from pyiceberg.table import Table

from expected_state.store import ExpectedStateStore
from reconcile import CommitCycle, CommitSucceeded, InvalidInputError, recover
from reconcile.core import hooks
from reconcile.core.contract import Change, Fatal, FencedError, SinkTxnId, WriterIdentity
from reconcile.engine.progress_file import FileProgressLog
from reconcile.testing import check_sink
from sinks.iceberg.rewrite import MERGE_MANIFESTS_AT
from sinks.iceberg.sink import COMMIT_CHECKED, IcebergSink
from sinks.registry import open_sink
from tests.fix_iceberg import IcebergHarness, catalog_uri

pytestmark = pytest.mark.integration

SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("name", pa.string()),
        ("amount", pa.decimal128(12, 2)),
        ("ratio", pa.float64()),
        ("day", pa.date32()),
        ("at", pa.timestamp("us")),
        ("flag", pa.bool_()),
        ("blob", pa.binary()),
    ]
)


def row(rng: random.Random, i: int, epoch: int) -> dict[str, Any]:
    return {
        "id": i,
        "name": rng.choice([None, "", f"n{i}-{epoch}", "héllo"]),
        "amount": rng.choice([None, decimal.Decimal(rng.randrange(-(10**6), 10**6)) / 100]),
        "ratio": rng.choice([None, 0.5, -2.25, float(epoch)]),
        "day": rng.choice([None, dt.date(2024, 1, 1) + dt.timedelta(days=i)]),
        "at": rng.choice([None, dt.datetime(2024, 1, 1, 12) + dt.timedelta(microseconds=i)]),
        "flag": rng.choice([None, True, False]),
        "blob": rng.choice([None, b"", bytes([i % 256, 7])]),
    }


def orders_sink(uri: str) -> IcebergSink:
    return IcebergSink("orders", f"{uri}&namespace=shop&key=id", schema=SCHEMA)


def written(uri: str, root: Path, epochs: int = 3) -> None:
    """Epochs 0..epochs-1 through a commit cycle into the sink, and the same into the store.

    Each epoch upserts 30 ids (10 of them written by the epoch before) and
    deletes one id of the epoch before.
    """
    rng = random.Random(3)
    store = ExpectedStateStore(str(root / "expected"), "shop", "orders", ["id"], schema=SCHEMA)
    cycle = CommitCycle("shop", [orders_sink(uri)], root / "progress")
    cycle.start()
    try:
        for e in range(epochs):
            changes = [Change("upsert", row(rng, i, e)) for i in range(e * 20, e * 20 + 30)]
            if e:
                changes.append(Change("delete", {"id": e * 20 - 20}))
            store.apply(e, changes)
            assert isinstance(cycle.run_epoch(e, {"orders": changes}), CommitSucceeded)
    finally:
        cycle.close()


def table_of(sink: IcebergSink) -> Table:
    table = sink.table()
    assert table is not None
    return table


def sink_rows(sink: IcebergSink) -> list[tuple[Any, ...]]:
    rows = table_of(sink).scan().to_arrow().select(SCHEMA.names).sort_by("id").to_pylist()
    return [tuple(r[n] for n in SCHEMA.names) for r in rows]


def expected(root: Path) -> list[tuple[Any, ...]]:
    store = ExpectedStateStore(str(root / "expected"), "shop", "orders", ["id"])
    rows = store.snapshot(columns=SCHEMA.names).sort_by("id").to_pylist()
    return [tuple(r[n] for n in SCHEMA.names) for r in rows]


def epoch_snapshots(table: Table) -> list[dict[str, str]]:
    found = []
    for snapshot in table.snapshots():
        summary: Any = snapshot.summary
        if summary.get("reconcile.kind") == "epoch":
            found.append({k: v for k, v in summary.additional_properties.items()})
            found[-1]["operation"] = str(summary.operation.value)
    return found


def test_the_sink_passes_check_sink(tmp_path: Path) -> None:
    counter = iter(range(1000))
    report = check_sink(lambda: IcebergHarness(tmp_path / f"h{next(counter)}"), matrix=False)
    assert report.ok and len(report.passed) == 13


def test_each_epoch_is_one_snapshot_that_a_replay_finds(tmp_path: Path) -> None:
    uri = catalog_uri(tmp_path)
    written(uri, tmp_path)
    sink = orders_sink(uri)
    table = table_of(sink)
    log_id = FileProgressLog(tmp_path / "progress", "shop").log_id
    snapshots = epoch_snapshots(table)
    assert [s["reconcile.epoch"] for s in snapshots] == ["0", "1", "2"]
    for s in snapshots:
        assert (s["reconcile.pipeline"], s["reconcile.sink"]) == ("shop", "orders")
        assert s["reconcile.log-id"] == log_id and s["reconcile.generation"] == "1"
        assert s["reconcile.txn"] == f"shop-orders-{s['reconcile.epoch']}-g1"
    # The generation's claim is the only other snapshot: one per epoch, plus one per writer.
    assert len(table.snapshots()) == 4
    assert sink_rows(sink) == expected(tmp_path)
    # A replay of epoch 1 (new values, a newer generation) finds its snapshot: OK, nothing written.
    replay = orders_sink(uri)
    replay.bind(WriterIdentity("shop", log_id))
    txn = SinkTxnId("shop", "orders", 1, 2)
    assert replay.stage(txn, [{"id": 25, "name": "replayed"}])
    assert replay.prepare(txn) and replay.commit(txn)
    assert len(table_of(sink).snapshots()) == 4 and sink_rows(sink) == expected(tmp_path)


def test_upserts_and_deletes_by_key_rewrite_only_the_files_they_touch(tmp_path: Path) -> None:
    uri = catalog_uri(tmp_path)
    sink = IcebergSink("kv", f"{uri}&key=g,k", schema=pa.schema([("g", pa.string()),
                       ("k", pa.int32()), ("v", pa.string())]))  # fmt: skip
    sink.bind(WriterIdentity("p", "log"))

    def epoch(e: int, items: list[Any]) -> None:
        txn = SinkTxnId("p", "kv", e, 1)
        assert sink.stage(txn, items) and sink.prepare(txn) and sink.commit(txn)

    epoch(0, [{"g": "a", "k": i, "v": f"a{i}"} for i in range(5)])
    epoch(1, [{"g": "b", "k": i, "v": f"b{i}"} for i in range(5)])
    before = {f.file.file_path for f in table_of(sink).scan().plan_files()}
    epoch(2, [
        {"g": "a", "k": 1, "v": "changed"},  # an upsert of a key that is in
        Change("delete", {"g": "a", "k": 3}),  # a delete by key
        {"g": "a", "k": 9, "v": "new"},
        {"g": "a", "k": 4, "v": "gone soon"}, Change("delete", {"g": "a", "k": 4}),  # netted
        Change("delete", {"g": "z", "k": 0}),  # a key that is not there: nothing
    ])  # fmt: skip
    table = table_of(sink)
    rows = table.scan().to_arrow().sort_by([("g", "ascending"), ("k", "ascending")])
    assert [(r["g"], r["k"], r["v"], r["_epoch"]) for r in rows.to_pylist()] == [
        ("a", 0, "a0", 0), ("a", 1, "changed", 2), ("a", 2, "a2", 0), ("a", 9, "new", 2),
        *[("b", i, f"b{i}", 1) for i in range(5)],
    ]  # fmt: skip
    last = epoch_snapshots(table)[-1]
    # ONE overwrite snapshot: epoch 0's file replaced, epoch 1's left as it was.
    assert last["operation"] == "overwrite" and last["reconcile.epoch"] == "2"
    after = {f.file.file_path for f in table.scan().plan_files()}
    assert len(before - after) == 1 and len(before & after) == 1
    assert len(epoch_snapshots(table)) == 3


def test_a_zombie_is_fenced_by_the_catalog_inside_its_commit(tmp_path: Path) -> None:
    # The zombie (generation 1) has read the table, found itself unfenced and
    # its epoch prepared, and is about to commit. Right there the successor
    # (generation 2) claims the table. The zombie's commit must not land: the
    # catalog refuses it (main moved), and its second look finds the fence.
    uri = catalog_uri(tmp_path)
    harness_schema = pa.schema([("k", pa.string()), ("v", pa.int64())])
    zombie = IcebergSink("s", f"{uri}&key=k", schema=harness_schema)
    successor = IcebergSink("s", f"{uri}&key=k", schema=harness_schema)
    old, new = SinkTxnId("p", "s", 1, 1), SinkTxnId("p", "s", 2, 2)
    assert zombie.stage(old, [{"k": "zombie", "v": -1}]) and zombie.prepare(old)
    assert successor.stage(new, [{"k": "successor", "v": 2}])

    def takeover() -> None:
        assert successor.prepare(new)

    with hooks.at(COMMIT_CHECKED, takeover) as armed:
        outcome = zombie.commit(old)
    assert armed.hits == 1
    assert isinstance(outcome, Fatal) and isinstance(outcome.error, FencedError), outcome
    assert successor.commit(new)
    table = table_of(successor)
    assert table.scan().to_arrow().column("k").to_pylist() == ["successor"]
    assert table.properties["reconcile.p.s.generation"] == "2"


def test_bad_rows_are_refused_by_table_column_and_value_and_nothing_is_written(
    tmp_path: Path,
) -> None:
    uri = catalog_uri(tmp_path)
    sink = orders_sink(uri)
    good = SinkTxnId("shop", "orders", 0, 1)
    assert sink.stage(good, [{"id": 1, "name": "one"}]) and sink.prepare(good)
    assert sink.commit(good)
    for e, rows, said in [
        (1, [{"id": "x1", "name": "bad"}], "value 'x1' does not fit column 'id'"),
        (2, [{"id": 2, "colour": "red"}], "column 'colour' is not in the table"),
        (3, [{"id": None, "name": "no key"}], "NULL in key column 'id'"),
        (4, [{"name": "no key"}], "no key column 'id'"),
    ]:
        txn = SinkTxnId("shop", "orders", e, 1)
        assert sink.stage(txn, rows)
        outcome = sink.prepare(txn)
        assert isinstance(outcome, Fatal) and said in outcome.reason, outcome
        assert "harness.shop.orders" in outcome.reason  # the table, by name
        assert "nothing was written" in outcome.reason
    assert sink_rows(sink) == [(1, "one", None, None, None, None, None, None)]
    assert list(sink.recover()) == []


def test_the_registry_opens_iceberg_uris(tmp_path: Path) -> None:
    sink = open_sink("events", catalog_uri(tmp_path) + "&namespace=ns&key=id")
    assert isinstance(sink, IcebergSink)
    assert sink.display == "harness.ns.events" and sink.key_columns() == ["id"]


@pytest.mark.parametrize("mode", ["full", "scoped", "auto"])
def test_hand_drift_is_counted_and_repaired_by_pull_and_diff(mode: str, tmp_path: Path) -> None:
    uri = catalog_uri(tmp_path)
    written(uri, tmp_path)
    dsn = f"{uri}&namespace=shop"
    store = str(tmp_path / "expected")
    # Scoped: the keys epoch 2 wrote, and the rows whose _epoch is past 1.
    scope: dict[str, Any] = {"since_epoch": 1} if mode == "scoped" else {}
    clean = recover(dsn, store, "shop", "orders", mode=mode, dry_run=True, **scope)
    assert not clean.drift
    # By hand, with pyiceberg itself: a row of the newest epoch deleted, one changed,
    # one that no epoch wrote added (with _epoch 2, so that scoped mode sees it).
    table = table_of(orders_sink(uri))
    table.delete(EqualTo("id", 55))
    changed = table.scan(row_filter=In("id", {41})).to_arrow()
    changed = changed.set_column(1, "name", pa.array(["by hand"], pa.large_string()))
    table.overwrite(changed, overwrite_filter=EqualTo("id", 41))
    extra = table.scan(row_filter=EqualTo("id", 42)).to_arrow()
    table.append(extra.set_column(0, extra.schema.field("id"), pa.array([999], pa.int64())))
    found = recover(dsn, store, "shop", "orders", mode=mode, dry_run=True, **scope)
    assert (found.missing, found.extra, found.changed) == (1, 1, 1), found
    repaired = recover(dsn, store, "shop", "orders", mode=mode, **scope)
    assert repaired.applied == 3
    assert sink_rows(orders_sink(uri)) == expected(tmp_path)
    again = recover(dsn, store, "shop", "orders", mode=mode, **scope)
    assert not again.drift and again.applied == 0


def test_a_sink_behind_the_store_is_brought_forward_and_its_epochs_count_as_in(
    tmp_path: Path,
) -> None:
    uri = catalog_uri(tmp_path)
    written(uri, tmp_path)
    rng = random.Random(9)
    store = ExpectedStateStore(str(tmp_path / "expected"), "shop", "orders", ["id"])
    store.apply(3, [Change("upsert", row(rng, i, 3)) for i in range(65, 75)]
                + [Change("delete", {"id": 41})])  # fmt: skip
    dsn = f"{uri}&namespace=shop"
    report = recover(dsn, str(tmp_path / "expected"), "shop", "orders", mode="scoped")
    assert (report.missing, report.extra) == (5, 1)
    sink = orders_sink(uri)
    assert sink_rows(sink) == expected(tmp_path)
    table = table_of(sink)
    assert table.properties["reconcile.shop.orders.epoch"] == "3"
    # The repair's snapshot stands for epoch 3: a writer's replay of it writes nothing.
    log_id = FileProgressLog(tmp_path / "progress", "shop").log_id
    writer = orders_sink(uri)
    writer.bind(WriterIdentity("shop", log_id))
    txn = SinkTxnId("shop", "orders", 3, 1)
    assert writer.stage(txn, [{"id": 1000}]) and writer.prepare(txn) and writer.commit(txn)
    assert sink_rows(orders_sink(uri)) == expected(tmp_path)


def test_buckets_mode_says_iceberg_has_no_checksums(tmp_path: Path) -> None:
    uri = catalog_uri(tmp_path)
    written(uri, tmp_path, epochs=1)
    with pytest.raises(InvalidInputError, match="no bucket checksums"):
        recover(f"{uri}&namespace=shop", str(tmp_path / "expected"), "shop", "orders",
                mode="buckets")  # fmt: skip


def test_arrow_batches_go_in_as_they_are_and_a_repeated_key_is_netted(tmp_path: Path) -> None:
    uri = catalog_uri(tmp_path)
    sink = IcebergSink(
        "kv", f"{uri}&key=k", schema=pa.schema([("k", pa.int64()), ("v", pa.string())])
    )
    batch = pa.table({"k": [1, 2, 3], "v": ["a", "b", "c"]})
    txn = SinkTxnId("p", "kv", 0, 1)
    assert sink.stage(txn, batch) and sink.prepare(txn) and sink.commit(txn)
    # Two batches that repeat key 2: the later one wins, as for rows.
    again = [pa.table({"k": [2, 4], "v": ["first", "d"]}), pa.table({"k": [2], "v": ["last"]})]
    txn = SinkTxnId("p", "kv", 1, 1)
    assert sink.stage(txn, again) and sink.prepare(txn) and sink.commit(txn)
    rows = table_of(sink).scan().to_arrow().sort_by("k").select(["k", "v", "_epoch"]).to_pylist()
    assert [(r["k"], r["v"], r["_epoch"]) for r in rows] == [
        (1, "a", 0), (2, "last", 1), (3, "c", 0), (4, "d", 1),
    ]  # fmt: skip
    bad = SinkTxnId("p", "kv", 2, 1)
    assert sink.stage(bad, pa.table({"k": ["five"], "v": ["e"]}))
    outcome = sink.prepare(bad)
    assert isinstance(outcome, Fatal) and "column 'k'" in outcome.reason, outcome
    assert len(table_of(sink).scan().to_arrow()) == 4


def test_a_partitioned_table_is_written_per_partition(tmp_path: Path) -> None:
    sink = IcebergSink("pt", f"{catalog_uri(tmp_path)}&key=g,k")
    catalog = sink.catalog()
    catalog.create_namespace("reconcile")
    schema = pa.schema([pa.field("g", pa.string(), nullable=False),
                        pa.field("k", pa.int64(), nullable=False), ("v", pa.string()),
                        ("_epoch", pa.int64())])  # fmt: skip
    with catalog.create_table("reconcile.pt", schema=schema).update_spec() as spec:
        spec.add_identity("g")
    epochs: list[list[Any]] = [
        [{"g": "a", "k": 1, "v": "x"}, {"g": "b", "k": 1, "v": "y"}],
        [{"g": "a", "k": 1, "v": "x2"}, Change("delete", {"g": "b", "k": 1}),
         {"g": "c", "k": 2, "v": "z"}],
    ]  # fmt: skip
    for epoch, rows in enumerate(epochs):
        txn = SinkTxnId("p", "pt", epoch, 1)
        assert sink.stage(txn, rows) and sink.prepare(txn) and sink.commit(txn)
    table = table_of(sink)
    found = table.scan().to_arrow().sort_by("g").select(["g", "k", "v"]).to_pylist()
    assert found == [{"g": "a", "k": 1, "v": "x2"}, {"g": "c", "k": 2, "v": "z"}]
    folders = sorted(task.file.file_path.split("/")[-2] for task in table.scan().plan_files())
    assert folders == ["g=a", "g=c"]


def test_the_epochs_manifests_are_merged_so_planning_does_not_grow_with_them(
    tmp_path: Path,
) -> None:
    sink = IcebergSink("kv", f"{catalog_uri(tmp_path)}&key=k",
                       schema=pa.schema([("k", pa.int64()), ("v", pa.int64())]))  # fmt: skip
    for epoch in range(MERGE_MANIFESTS_AT + 4):
        txn = SinkTxnId("p", "kv", epoch, 1)
        rows = [{"k": epoch * 10 + i, "v": epoch} for i in range(10)]
        if epoch:
            rows.append({"k": epoch * 10 - 1, "v": -epoch})  # one row of the epoch before
        assert sink.stage(txn, rows) and sink.prepare(txn) and sink.commit(txn)
    table = table_of(sink)
    snapshot = table.current_snapshot()
    assert snapshot is not None
    assert len(snapshot.manifests(table.io)) < MERGE_MANIFESTS_AT
    assert len(table.scan().to_arrow()) == 10 * (MERGE_MANIFESTS_AT + 4)


def test_a_key_held_twice_is_repaired_to_one_copy_never_to_none(tmp_path: Path) -> None:
    """An Iceberg table has no unique key: a hand append can hold a row twice.

    The repair deletes by key, so it drops both copies; the expected row must
    go back in with it, or the repair itself would lose the row.
    """
    uri = catalog_uri(tmp_path)
    written(uri, tmp_path)
    dsn, store = f"{uri}&namespace=shop", str(tmp_path / "expected")
    table = table_of(orders_sink(uri))
    table.append(table.scan(row_filter=EqualTo("id", 41)).to_arrow())  # the same row again
    found = recover(dsn, store, "shop", "orders", mode="full", dry_run=True)
    assert (found.missing, found.extra, found.changed) == (0, 1, 0), found
    recover(dsn, store, "shop", "orders", mode="full", allow_mass_change=True)
    held = table_of(orders_sink(uri)).scan(row_filter=EqualTo("id", 41)).to_arrow()
    assert held.num_rows == 1
    assert sink_rows(orders_sink(uri)) == expected(tmp_path)
    assert not recover(dsn, store, "shop", "orders", mode="full", dry_run=True).drift
