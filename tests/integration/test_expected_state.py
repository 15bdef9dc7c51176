"""Integration tests of the expected-state store on real Delta tables in tmp dirs."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from expected_state.delta_commit import BasedOn, DeltaCommit, commit_files, write_data_file
from expected_state.epochs import EpochLog
from expected_state.fencing import fence_app_id
from expected_state.store import ExpectedStateStore
from reconcile.core.contract import (
    Change,
    EpochOrderError,
    FencedError,
    InvalidInputError,
)
from reconcile.core.hashing import row_hash_arrow

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
SCHEMA = pa.schema([pa.field("k", pa.string()), pa.field("v", pa.int64())])


def store_at(root: Path, generation: int = 0) -> ExpectedStateStore:
    return ExpectedStateStore(str(root), "pipe", "orders", ["k"], generation=generation)


def as_map(table: pa.Table) -> dict[str, int]:
    return {r["k"]: r["v"] for r in table.to_pylist()}


def run_python(code: str, *args: str, **kwargs: Any) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )


def test_reapply_is_a_noop(tmp_path: Path) -> None:
    store = store_at(tmp_path)
    changes = [Change("upsert", {"k": "a", "v": 1}), Change("upsert", {"k": "b", "v": 2})]
    first = store.apply(1, changes)
    version = DeltaTable(store.uri).version()
    again = store.apply(1, changes)
    # A fresh client (a restarted process) replays it too.
    replay = store_at(tmp_path).apply(1, pa.table({"k": ["z"], "v": [9], "_op": ["upsert"]}))
    assert first.applied and not again.applied and not replay.applied
    assert DeltaTable(store.uri).version() == version
    assert as_map(store.snapshot()) == {"a": 1, "b": 2}
    assert list(store.epoch_versions()) == [1]


def test_an_empty_first_epoch_takes_its_schema_from_arrow_not_from_nothing(
    tmp_path: Path,
) -> None:
    """An empty Arrow table still types the table; no rows and no types are refused."""
    store = store_at(tmp_path)
    assert store.apply(0, SCHEMA.empty_table()).applied
    assert store.user_schema == SCHEMA and store.snapshot().num_rows == 0
    store.apply(1, [Change("upsert", {"k": "a", "v": 1})])
    assert as_map(store.snapshot()) == {"a": 1}

    untyped = store_at(tmp_path / "untyped")
    nothing = pa.table({"k": pa.array([], pa.string()), "v": pa.array([], pa.null())})
    with pytest.raises(InvalidInputError, match="cannot infer the table's schema"):
        untyped.apply(0, nothing)
    assert untyped.last_epoch() is None


def test_time_travel_to_every_epoch_matches_a_model(tmp_path: Path) -> None:
    store = store_at(tmp_path)
    rng = random.Random(7)
    model: dict[str, int] = {}
    expected: dict[int, dict[str, int]] = {}
    epoch = 0
    for step in range(12):
        epoch += 2 if step % 5 == 4 else 1  # some epochs are skipped, with leave
        changes = []
        for _ in range(rng.randint(0, 8)):
            key = f"k{rng.randint(0, 15)}"
            if rng.random() < 0.3:
                changes.append(Change("delete", {"k": key}))
                model.pop(key, None)
            else:
                value = rng.randint(0, 1000)
                changes.append(Change("upsert", {"k": key, "v": value}))
                model[key] = value
        if not changes:
            changes = [Change("upsert", {"k": "seed", "v": epoch})]
            model["seed"] = epoch
        store.apply(epoch, changes, allow_gap=True)
        expected[epoch] = dict(model)
    for e, state in expected.items():
        snap = store.snapshot(e)
        assert as_map(snap) == state, e
        assert snap.column("_row_hash").to_pylist() == row_hash_arrow(snap, ["k", "v"]).to_pylist()
        keys = snap.column("k").to_pylist()
        assert len(keys) == len(set(keys))  # one row per key
    skipped = [e for e in range(1, epoch) if e not in expected]
    assert skipped, "the sequence must skip an epoch"
    for e in skipped:  # a skipped epoch had no output: its state is the one before
        assert as_map(store.snapshot(e)) == expected[max(x for x in expected if x < e)]


def test_deletes_leave_current_version_but_time_travel_keeps_them(tmp_path: Path) -> None:
    store = store_at(tmp_path)
    store.apply(1, [Change("upsert", {"k": "a", "v": 1}), Change("upsert", {"k": "b", "v": 2})])
    store.apply(2, [Change("delete", {"k": "a"}), Change("delete", {"k": "nope"})])
    assert as_map(store.snapshot()) == {"b": 2}
    assert as_map(store.snapshot(1)) == {"a": 1, "b": 2}
    # changed_keys reads only the change files after the epoch, never the table, so
    # a delete of a key that did not exist ("nope") is listed too: a diff of that
    # key finds it absent on both sides.
    changed = sorted(store.changed_keys(1).to_pylist(), key=lambda r: r["k"])
    assert changed == [{"k": "a", "_deleted": True}, {"k": "nope", "_deleted": True}]
    store.apply(3, [Change("upsert", {"k": "c", "v": 3})])
    assert sorted(store.changed_keys(1).to_pylist(), key=lambda r: r["k"]) == [
        {"k": "a", "_deleted": True},
        {"k": "c", "_deleted": False},
        {"k": "nope", "_deleted": True},
    ]
    assert store.changed_keys(2).to_pylist() == [{"k": "c", "_deleted": False}]


def test_last_change_of_a_key_wins_within_an_epoch(tmp_path: Path) -> None:
    store = store_at(tmp_path)
    store.apply(
        1,
        pa.table(
            {"k": ["a", "a", "b", "b"], "v": [1, 2, 3, None], "_op": ["upsert"] * 3 + ["delete"]}
        ),
    )
    assert as_map(store.snapshot()) == {"a": 2}


def test_epoch_order_errors(tmp_path: Path) -> None:
    store = store_at(tmp_path)
    row = [Change("upsert", {"k": "a", "v": 1})]
    store.apply(5, row)
    with pytest.raises(EpochOrderError, match=r"skips epochs 6\.\.6"):
        store.apply(7, row)
    store.apply(7, row, allow_gap=True)
    with pytest.raises(EpochOrderError, match="epoch 6 goes backwards"):
        store.apply(6, row)
    with pytest.raises(EpochOrderError):
        store.apply(3, row)
    assert store.last_epoch() == 7
    assert not store.apply(5, row).applied  # 5 was recorded: a replay, not an error


@pytest.mark.parametrize(
    ("changes", "column"),
    [
        (pa.table({"k": ["a"], "v": ["not a number"], "_op": ["upsert"]}), "v"),
        (pa.table({"k": ["a"], "_op": ["upsert"]}), "v"),
        (pa.table({"k": ["a"], "v": [1], "w": [2], "_op": ["upsert"]}), "w"),
        (pa.table({"k": pa.array([None], pa.string()), "v": [1], "_op": ["upsert"]}), "k"),
        (pa.table({"k": ["a"], "v": [1], "_op": ["merge"]}), "_op"),
        (pa.table({"k": ["a"], "v": [1], "_epoch": [1], "_op": ["upsert"]}), "_epoch"),
    ],
)
def test_schema_mismatch_is_rejected_naming_the_column(
    tmp_path: Path, changes: pa.Table, column: str
) -> None:
    store = store_at(tmp_path)
    store.apply(1, [Change("upsert", {"k": "a", "v": 1})])
    version = DeltaTable(store.uri).version()
    with pytest.raises(InvalidInputError, match="nothing was written") as info:
        store.apply(2, changes)
    assert info.value.details["column"] == column
    assert repr(column) in str(info.value) and store.uri in str(info.value)
    assert DeltaTable(store.uri).version() == version
    assert store.last_epoch() == 1


def test_stale_generation_is_rejected(tmp_path: Path) -> None:
    old = ExpectedStateStore(str(tmp_path), "pipe", "orders", ["k"], schema=SCHEMA, generation=1)
    old.claim()
    old.apply(1, [Change("upsert", {"k": "a", "v": 1})])
    new = ExpectedStateStore(str(tmp_path), "pipe", "orders", ["k"], generation=2)
    new.claim()
    version = DeltaTable(old.uri).version()
    with pytest.raises(FencedError, match="generation 1 is fenced off by generation 2"):
        old.apply(2, [Change("upsert", {"k": "zombie", "v": 666})])
    with pytest.raises(FencedError):
        old.vacuum(retention_hours=0, safety_margin_minutes=0)
    with pytest.raises(FencedError):
        old.epochs.record(2, "applied")
    with pytest.raises(FencedError):
        ExpectedStateStore(str(tmp_path), "pipe", "orders", ["k"], generation=1).claim()
    assert DeltaTable(old.uri).version() == version
    new.apply(2, [Change("upsert", {"k": "b", "v": 2})])
    assert as_map(new.snapshot()) == {"a": 1, "b": 2}


def test_fence_holds_when_takeover_lands_between_check_and_commit(tmp_path: Path) -> None:
    # The zombie has checked the fence and holds a table snapshot; then the new
    # writer takes over; the zombie's commit must fail inside Delta's commit.
    uri = str(tmp_path / "t")
    data = pa.table({"k": ["a"], "v": [1]})
    fence = fence_app_id("pipe", "orders")
    commit_files(DeltaCommit(table_uri=uri, schema=data.schema, app_id=fence, version=1))
    zombie_view = DeltaTable(uri)
    takeover = DeltaCommit(table_uri=uri, schema=data.schema, app_id=fence, version=2)
    commit_files(takeover)
    f = write_data_file(uri, "zombie.parquet", data)
    with pytest.raises(FencedError, match="generation 1 is fenced off by generation 2"):
        zombie = DeltaCommit(
            table_uri=uri,
            schema=data.schema,
            app_id="pipe/orders",
            version=1,
            add=[f],
            fence=(fence, 1),
            max_retries=2,
        )
        commit_files(zombie, BasedOn(zombie_view))
    assert DeltaTable(uri).transaction_version("pipe/orders") is None
    assert pa.table(DeltaTable(uri).to_pyarrow_table()).num_rows == 0


def test_commit_files_is_idempotent_and_checks_schema(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    data = pa.table({"k": ["a", "b"], "v": [1, 2]})
    f = write_data_file(uri, "part-1.parquet", data)
    first = DeltaCommit(table_uri=uri, schema=data.schema, app_id="x", version=1, add=[f])
    assert commit_files(first).committed
    assert not commit_files(first).committed
    bad = write_data_file(uri, "bad.parquet", pa.table({"k": ["c"], "v": [1.5]}))
    with pytest.raises(
        InvalidInputError, match=r"column 'v' in file 'bad\.parquet' has type double"
    ):
        commit_files(
            DeltaCommit(table_uri=uri, schema=data.schema, app_id="x", version=2, add=[bad])
        )
    assert pa.table(DeltaTable(uri).to_pyarrow_table()).num_rows == 2


CRASH_WORKER = """
    import sys, time
    import expected_state.store as store_module
    from expected_state.store import ExpectedStateStore
    from reconcile.core.contract import Change

    def hang(*args, **kwargs):
        print("FILES-WRITTEN", flush=True)  # the data files are on disk; commit not begun
        time.sleep(600)

    store = ExpectedStateStore(sys.argv[1], "pipe", "orders", ["k"])
    store_module.commit_files = hang  # the crash point: between the file writes and the commit
    store.apply(2, [Change("upsert", {"k": "a", "v": 99}), Change("upsert", {"k": "new", "v": 7})])
"""


@pytest.mark.chaos
def test_kill_9_between_file_writes_and_commit_leaves_nothing_visible(tmp_path: Path) -> None:
    store = store_at(tmp_path)
    store.apply(1, [Change("upsert", {"k": "a", "v": 1}), Change("upsert", {"k": "b", "v": 2})])
    before = set(os.listdir(store.uri))
    proc = run_python(CRASH_WORKER, str(tmp_path))
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "FILES-WRITTEN", (
        proc.stderr.read() if proc.stderr else ""
    )
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    orphans = set(os.listdir(store.uri)) - before
    assert orphans, "the worker wrote data files before it was killed"
    restarted = store_at(tmp_path)
    assert restarted.last_epoch() == 1
    assert as_map(restarted.snapshot()) == {"a": 1, "b": 2}
    # The restarted writer applies the epoch exactly once; vacuum removes the orphans.
    assert restarted.apply(2, [Change("upsert", {"k": "a", "v": 99})]).applied
    assert as_map(restarted.snapshot()) == {"a": 99, "b": 2}
    report = restarted.vacuum(retention_hours=0, safety_margin_minutes=0)
    assert orphans <= set(report.deleted_files)
    assert as_map(restarted.snapshot(1)) == {"a": 1, "b": 2}  # kept: recovery may need it


CONCURRENT_WORKER = """
    import json, sys
    from expected_state.store import ExpectedStateStore
    from reconcile.core.contract import Change, RetryableError

    store = ExpectedStateStore(sys.argv[1], "pipe", "orders", ["k"])
    outcomes = {"applied": 0, "noop": 0, "retries": 0}
    for epoch in range(1, 16):
        changes = [Change("upsert", {"k": f"k{epoch % 7}", "v": epoch}),
                   Change("upsert", {"k": f"e{epoch}", "v": epoch})]
        while True:
            try:
                result = store.apply(epoch, changes)
                break
            except RetryableError:
                outcomes["retries"] += 1
                store = ExpectedStateStore(sys.argv[1], "pipe", "orders", ["k"])
        outcomes["applied" if result.applied else "noop"] += 1
    print(json.dumps(outcomes))
"""


@pytest.mark.chaos
def test_two_processes_writing_one_table_do_not_corrupt_it(tmp_path: Path) -> None:
    procs = [run_python(CONCURRENT_WORKER, str(tmp_path)) for _ in range(2)]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        results.append(json.loads(out))
    assert sum(r["applied"] for r in results) == 15  # every epoch exactly once
    store = store_at(tmp_path)
    expected = {f"k{e % 7}": e for e in range(1, 16)} | {f"e{e}": e for e in range(1, 16)}
    assert as_map(store.snapshot()) == expected
    commits = [c for c in DeltaTable(store.uri).history() if "reconcile.epoch" in c]
    assert sorted(c["reconcile.epoch"] for c in commits) == list(range(1, 16))
    assert list(store.epoch_versions()) == list(range(1, 16))
    for e in range(1, 16):
        assert store.snapshot(e).num_rows == min(e, 7) + e


def test_compaction_and_vacuum_keep_what_recovery_needs(tmp_path: Path) -> None:
    store = store_at(tmp_path)
    states = {}
    for e in range(1, 9):
        store.apply(
            e, [Change("upsert", {"k": f"k{e}", "v": e}), Change("delete", {"k": f"k{e - 2}"})]
        )
        states[e] = as_map(store.snapshot())
    store.compact()
    # Merge-on-read: one base folded through epoch 7, and the newest epoch's change
    # file, which compaction leaves alone so that the epoch stays revertible.
    names = sorted(Path(u).name for u in DeltaTable(store.uri).file_uris())
    assert [n.split("-")[:2] for n in names] == [
        ["base", "t000000000007"],
        ["change", "e000000000008"],
    ]
    for e, state in states.items():
        assert as_map(store.snapshot(e)) == state
    # A checkpoint newer than what must be kept: the log may be cut at a checkpoint
    # at or before epoch 3's version only (there is none), never at this one.
    store.checkpoint()
    report = store.vacuum(
        keep_from_epoch=3, keep_epochs=2, retention_hours=0, safety_margin_minutes=0
    )
    assert report.kept_epochs == [3, 4, 5, 6, 7, 8]
    for e in range(3, 9):
        assert as_map(store.snapshot(e)) == states[e]
    assert store.changed_keys(3).num_rows > 0
    # Later epochs, another fold and a vacuum keeping only the last two: epoch 1's
    # files (or its version) are gone, and reading it says so.
    for e in range(9, 30):
        store.apply(e, [Change("upsert", {"k": f"k{e}", "v": e})])
        if e == 27:
            store.checkpoint()  # what maintain() does between epochs: vacuum cuts the log there
    store.compact()
    store.vacuum(keep_epochs=2, retention_hours=0, safety_margin_minutes=0)
    with pytest.raises(InvalidInputError, match="files of epoch 1 are gone"):
        store.snapshot(1)
    with pytest.raises(InvalidInputError, match="changes after epoch 1 are no longer all known"):
        store_at(tmp_path).changed_keys(1)  # a fresh reader: the pruned log is all it has
    assert as_map(store.snapshot(28)) == {
        k: v for k, v in as_map(store.snapshot()).items() if k != "k29"
    }


def test_epoch_log_record_status_last_epoch(tmp_path: Path) -> None:
    log = EpochLog(str(tmp_path), "pipe", "orders")
    assert log.last_epoch() is None and log.status(1) is None
    assert log.record(1, "committed", xid="7412", counts={"upserted": 3})
    assert not log.record(1, "committed", xid="7412")
    assert log.record(2, "committed")
    other = EpochLog(str(tmp_path), "pipe", "customers")
    other.record(9, "committed")
    assert log.status(1) == "committed" and log.last_epoch() == 2
    assert log.records()[0].xid == "7412" and log.records()[0].rows_upserted == 3
    assert other.last_epoch("committed") == 9
