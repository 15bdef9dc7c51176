"""Pull-and-diff on a real Delta table (delta-rs, local disk) and a real expected-state store.

Drift made by hand with deltalake is found by verify and repaired in ONE new
Delta version, read back from the table itself; scoped mode looks only at the
newest epochs; a commit that lands between the pull and the repair is never
overwritten; the repair raises the sink's high-water mark.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, TableFeatures, write_deltalake

from expected_state.store import ExpectedStateStore
from reconcile import CommitCycle, CommitSucceeded, InvalidInputError, recover
from reconcile.core import hooks
from reconcile.core.contract import Change, FencedError, SinkTxnId, WriterIdentity
from reconcile.engine.progress_file import FileProgressLog
from reconcile.recovery import recover_sink
from reconcile.recovery.engine import PULLED
from sinks.delta.factory import DeltaTableClient
from sinks.delta.sink import DeltaSink
from tests.cli_run import cli

pytestmark = pytest.mark.integration

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("amount", pa.float64())])
COLUMNS = [*SCHEMA.names, "_epoch"]


def row(i: int, epoch: int) -> dict[str, Any]:
    return {"id": i, "name": f"n{i}", "amount": float(i * 10 + epoch)}


def written(root: Path, epochs: int = 3) -> str:
    """Epochs 0..epochs-1 (10 new ids each) into the sink and the store; the dsn."""
    store = ExpectedStateStore(str(root / "expected"), "shop", "orders", ["id"], schema=SCHEMA)
    cycle = CommitCycle("shop", [DeltaSink("orders", root / "lake", schema=SCHEMA)],
                        root / "progress")  # fmt: skip
    cycle.start()
    try:
        for e in range(epochs):
            rows = [row(i, e) for i in range(e * 10, e * 10 + 10)]
            store.apply(e, [Change("upsert", r) for r in rows])
            assert isinstance(cycle.run_epoch(e, {"orders": rows}), CommitSucceeded)
    finally:
        cycle.close()
    return f"delta://{root / 'lake'}?key=id"


def table_rows(root: Path) -> list[dict[str, Any]]:
    data = DeltaTable(str(root / "lake" / "orders")).to_pyarrow_table(columns=COLUMNS)
    return data.sort_by("id").to_pylist()


def expected_rows(root: Path) -> list[dict[str, Any]]:
    store = ExpectedStateStore(str(root / "expected"), "shop", "orders", ["id"])
    return store.snapshot(columns=SCHEMA.names).sort_by("id").to_pylist()


def verify(root: Path, dsn: str, **options: Any) -> Any:
    return recover(dsn, str(root / "expected"), "shop", "orders", dry_run=True, **options)


def repair(root: Path, dsn: str, **options: Any) -> Any:
    return recover(dsn, str(root / "expected"), "shop", "orders", **options)


def drift(root: Path, ids: set[int], add: list[dict[str, Any]]) -> None:
    """By hand, with deltalake: the rows of ``ids`` deleted, then ``add`` appended."""
    uri = str(root / "lake" / "orders")
    table = DeltaTable(uri)
    table.delete(" OR ".join(f"id = {i}" for i in sorted(ids)))
    if add:
        schema = pa.schema(table.schema().to_arrow())
        write_deltalake(uri, pa.Table.from_pylist(add, schema=schema), mode="append")


def test_verify_finds_and_repair_fixes_drift_in_one_delta_version(tmp_path: Path) -> None:
    dsn = written(tmp_path)
    assert not verify(tmp_path, dsn, mode="full").drift
    # Missing: 3; extra: 99; changed in two columns: 12. Row 21 differs in _epoch
    # only: not drift, the diff compares the expected state's columns.
    drift(tmp_path, {3, 12, 21}, [
        {"id": 99, "name": "extra", "amount": 1.0, "_epoch": 2},
        {"id": 12, "name": "by hand", "amount": -1.0, "_epoch": 1},
        {**row(21, 2), "_epoch": 0},
    ])  # fmt: skip
    found = verify(tmp_path, dsn, mode="full")
    assert (found.missing, found.extra, found.changed) == (1, 1, 1), found
    before = DeltaTable(str(tmp_path / "lake" / "orders")).version()
    repaired = repair(tmp_path, dsn, mode="full")
    assert repaired.applied == 3
    table = DeltaTable(str(tmp_path / "lake" / "orders"))
    assert table.version() == before + 1  # ONE new Delta version
    assert table.history(1)[0]["reconcile.kind"] == "repair"
    rows = table_rows(tmp_path)
    assert [{k: r[k] for k in SCHEMA.names} for r in rows] == expected_rows(tmp_path)
    epochs = {r["id"]: r["_epoch"] for r in rows}
    assert (epochs[3], epochs[12], epochs[21]) == (2, 2, 0)  # repaired rows: the target epoch
    again = repair(tmp_path, dsn, mode="full")
    assert not again.drift and again.applied == 0
    assert DeltaTable(str(tmp_path / "lake" / "orders")).version() == before + 1


def test_scoped_mode_looks_at_the_newest_epochs_only(tmp_path: Path) -> None:
    dsn = written(tmp_path)
    # Epoch 0's row changed by hand keeps _epoch 0: older than scoped mode looks.
    drift(tmp_path, {5, 25}, [{**row(5, 0), "name": "old drift", "_epoch": 0},
                              {**row(25, 2), "name": "new drift", "_epoch": 2}])  # fmt: skip
    scoped = verify(tmp_path, dsn, mode="scoped", since_epoch=1)
    assert (scoped.missing, scoped.extra, scoped.changed) == (0, 0, 1), scoped
    assert scoped.rows_pulled < 30  # not the whole table
    full = verify(tmp_path, dsn, mode="full")
    assert full.changed == 2, full


def test_an_empty_table_is_filled_from_the_store(tmp_path: Path) -> None:
    dsn = written(tmp_path, epochs=2)
    DeltaTable(str(tmp_path / "lake" / "orders")).delete()
    found = verify(tmp_path, dsn, mode="full")
    assert (found.missing, found.extra, found.changed) == (20, 0, 0), found
    assert repair(tmp_path, dsn, mode="full").applied == 20
    rows = table_rows(tmp_path)
    assert [{k: r[k] for k in SCHEMA.names} for r in rows] == expected_rows(tmp_path)


def test_a_commit_between_the_pull_and_the_repair_is_not_overwritten(tmp_path: Path) -> None:
    dsn = written(tmp_path)
    drift(tmp_path, {4}, [])
    uri = str(tmp_path / "lake" / "orders")
    seen: list[int] = []

    def hand_write() -> None:
        # Another writer's commit lands after the pull read its version.
        seen.append(DeltaTable(uri).version())
        schema = pa.schema(DeltaTable(uri).schema().to_arrow())
        data = pa.Table.from_pylist([{"id": 77, "name": "late", "amount": 7.0, "_epoch": 2}],
                                    schema=schema)  # fmt: skip
        write_deltalake(uri, data, mode="append")

    with hooks.at(PULLED, hand_write) as armed:
        report = repair(tmp_path, dsn, mode="full")
    assert armed.fired == 1
    table = DeltaTable(uri)
    # The late commit is in the log; the repair was made after it, on a pull that saw it.
    assert table.version() == seen[0] + 2
    assert table.history(1)[0]["reconcile.kind"] == "repair"
    assert report.extra == 1 and report.missing == 1
    rows = table_rows(tmp_path)
    assert [{k: r[k] for k in SCHEMA.names} for r in rows] == expected_rows(tmp_path)


def test_the_repair_raises_the_high_water_mark_and_a_replay_writes_nothing(
    tmp_path: Path,
) -> None:
    dsn = written(tmp_path, epochs=2)
    store = ExpectedStateStore(str(tmp_path / "expected"), "shop", "orders", ["id"])
    store.apply(2, [Change("upsert", row(i, 2)) for i in range(50, 55)])
    report = repair(tmp_path, dsn, mode="scoped")
    assert report.missing == 5
    table = DeltaTable(str(tmp_path / "lake" / "orders"))
    assert table.transaction_version("shop/orders") == 2
    # A writer's replay of epoch 2 finds it in and adds nothing.
    sink = DeltaSink("orders", tmp_path / "lake", schema=SCHEMA)
    sink.bind(WriterIdentity("shop", FileProgressLog(tmp_path / "progress", "shop").log_id))
    txn = SinkTxnId("shop", "orders", 2, 1)
    assert sink.stage(txn, [row(1000, 2)]) and sink.prepare(txn) and sink.commit(txn)
    assert DeltaTable(str(tmp_path / "lake" / "orders")).version() == table.version()
    rows = table_rows(tmp_path)
    assert [{k: r[k] for k in SCHEMA.names} for r in rows] == expected_rows(tmp_path)


def test_buckets_mode_says_delta_has_no_checksums(tmp_path: Path) -> None:
    dsn = written(tmp_path, epochs=1)
    with pytest.raises(InvalidInputError, match="no bucket checksums"):
        verify(tmp_path, dsn, mode="buckets")


def test_the_pull_reads_the_version_it_began_at(tmp_path: Path) -> None:
    written(tmp_path, epochs=1)
    uri = str(tmp_path / "lake" / "orders")
    target = DeltaTableClient("orders", uri, ["id"]).recovery_target("shop", None, write=False)
    with target.snapshot(SCHEMA, ["id"]) as snap:
        schema = pa.schema(DeltaTable(uri).schema().to_arrow())
        late = pa.Table.from_pylist([{**row(500, 1), "_epoch": 1}], schema=schema)
        write_deltalake(uri, late, mode="append")  # lands after the pull began
        pulled = snap.pull_all(None)
        scoped = snap.pull_keys(pa.table({"id": pa.array([500], pa.int64())}), newer_than=0)
    assert DeltaTable(uri).to_pyarrow_table().num_rows == 11  # the late row is in the table
    assert sorted(pulled.column("id").to_pylist()) == list(range(10))
    assert scoped.num_rows == 0


def test_a_feature_delta_rs_cannot_write_is_refused_by_name(tmp_path: Path) -> None:
    dsn = written(tmp_path, epochs=1)
    uri = str(tmp_path / "lake" / "orders")
    table = DeltaTable(uri)
    table.alter.add_feature(TableFeatures.ChangeDataFeed, allow_protocol_versions_increase=True)
    drift(tmp_path, {2}, [])
    before = DeltaTable(uri).version()
    assert verify(tmp_path, dsn, mode="full").missing == 1  # verify still reads it
    with pytest.raises(InvalidInputError, match=r"orders: .*feature 'changeDataFeed'"):
        repair(tmp_path, dsn, mode="full")
    assert DeltaTable(uri).version() == before  # nothing was written
    # A feature deltalake cannot even read: verify says so, naming the table.
    DeltaTable(uri).alter.add_feature(
        TableFeatures.DeletionVectors, allow_protocol_versions_increase=True
    )
    with pytest.raises(InvalidInputError, match=r"orders: .*deletionVectors"):
        verify(tmp_path, dsn, mode="full")


def test_verify_and_repair_from_the_cli(tmp_path: Path) -> None:
    written(tmp_path, epochs=2)
    config = tmp_path / "reconcile.toml"
    config.write_text(
        f"""
[store]
root = "expected"

[pipelines.shop.sinks.orders]
url = "delta://{tmp_path / "lake"}"
table = "orders"
keys = ["id"]
"""
    )
    drift(tmp_path, {7}, [])
    found = cli("verify", "--config", str(config), "--all", "--json")
    assert found.returncode == 1, found.stderr
    [table] = json.loads(found.stdout)["tables"]
    assert (table["sink"], table["missing"], table["extra"], table["changed"]) == (
        "orders", 1, 0, 0,
    )  # fmt: skip
    repaired = cli("repair", "--config", str(config), "--pipeline", "shop", "--table", "orders")
    assert repaired.returncode == 1, repaired.stderr  # drift was found (and repaired)
    rows = table_rows(tmp_path)
    assert [{k: r[k] for k in SCHEMA.names} for r in rows] == expected_rows(tmp_path)


def test_a_repair_by_an_older_generation_is_fenced(tmp_path: Path) -> None:
    written(tmp_path, epochs=2)  # the cycle wrote as generation 1
    drift(tmp_path, {7}, [])
    uri = str(tmp_path / "lake" / "orders")
    before = DeltaTable(uri).version()
    sink = DeltaSink("orders", tmp_path / "lake", schema=SCHEMA)
    sink.bind(WriterIdentity("shop", FileProgressLog(tmp_path / "progress", "shop").log_id))
    store = ExpectedStateStore(str(tmp_path / "expected"), "shop", "orders", ["id"])
    with pytest.raises(FencedError, match="generation 0 is fenced off by generation 1"):
        recover_sink(sink, store, 0, mode="full")
    assert DeltaTable(uri).version() == before  # nothing was written
    assert recover_sink(sink, store, 1, mode="full").applied == 1  # its own generation may
    rows = table_rows(tmp_path)
    assert [{k: r[k] for k in SCHEMA.names} for r in rows] == expected_rows(tmp_path)


def test_a_repeated_key_keeps_one_copy(tmp_path: Path) -> None:
    dsn = written(tmp_path, epochs=2)
    uri = str(tmp_path / "lake" / "orders")
    schema = pa.schema(DeltaTable(uri).schema().to_arrow())
    # A Delta table has no unique key: id 5 twice (the same row), id 98 twice (no such id).
    copies = [{**row(5, 0), "_epoch": 0}, {"id": 98, "name": "x", "amount": 0.0, "_epoch": 1}]
    write_deltalake(uri, pa.Table.from_pylist(copies * 2, schema=schema)[1:], mode="append")
    found = verify(tmp_path, dsn, mode="full")
    assert (found.missing, found.extra, found.changed) == (0, 3, 0), found
    # The three surplus copies go, and id 5's expected row is written again: the
    # engine hands a repeated expected key's row back with the repair.
    assert repair(tmp_path, dsn, mode="full", allow_mass_change=True).applied == 4
    rows = table_rows(tmp_path)
    assert [{k: r[k] for k in SCHEMA.names} for r in rows] == expected_rows(tmp_path)


def test_scoped_rows_of_a_two_column_key_are_taken_exactly(tmp_path: Path) -> None:
    written(tmp_path, epochs=2)
    uri = str(tmp_path / "lake" / "orders")
    keys = ["id", "name"]
    target = DeltaTableClient("orders", uri, keys).recovery_target("shop", None, write=False)
    staged = pa.table({"id": pa.array([3, 4], pa.int64()), "name": ["n3", "not n4"]})
    with target.snapshot(SCHEMA, keys) as snap:
        assert snap.newest_epoch == 1
        pulled = snap.pull_keys(staged, newer_than=0)
    # (3, n3) is staged; (4, n4) is not (its name differs); epoch 1 wrote ids 10..19.
    assert sorted(pulled.column("id").to_pylist()) == [3, *range(10, 20)]
    assert pulled.column_names == SCHEMA.names
