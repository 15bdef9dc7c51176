"""Housekeeping keeps exactly what recovery and readers need, on a real delta-rs store on disk.

What must stay: the versions of a sink behind (``keep_from_epoch``), the
versions a running verify, repair or rebuild holds (``expected_state.holds``),
and files younger than the safety margin (written ahead of their commit).
Everything else goes at the next vacuum, not a day later. Each kept version is
shown by reading it in full after the vacuum; each dropped file by its absence
from the folder.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from expected_state.disk_use import table_disk_use
from expected_state.holds import HOLDS_DIR, held_versions
from expected_state.store import ExpectedStateStore
from reconcile.core.contract import InvalidInputError
from reconcile.engine.expected import ExpectedState

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.int64())])
WAIT_S = 30.0  # a bound on every wait, so that a broken run fails instead of hanging


def _store(root: Path, sink: str = "orders") -> ExpectedStateStore:
    return ExpectedStateStore(str(root), "shop", sink, ["k"], schema=SCHEMA)


def _as_map(table: pa.Table) -> dict[int, int]:
    return dict(zip(*(table.column(c).to_pylist() for c in ("k", "v")), strict=True))


def _epochs(
    store: ExpectedStateStore, first: int, last: int, states: dict[int, dict[int, int]]
) -> None:
    """Apply epochs ``first..last`` (each updates a third of 30 keys), recording each state."""
    state = dict(states[max(states)]) if states else {}
    for e in range(first, last + 1):
        rows = {k: e * 100 + k for k in range(e % 3, 30, 3)}
        store.apply(
            e, pa.table({"k": list(rows), "v": list(rows.values()), "_op": ["upsert"] * 10})
        )
        state.update(rows)
        states[e] = dict(state)


def _data_files(table: Path) -> set[str]:
    """The names of the data files in the table's folder."""
    return {p.name for p in table.rglob("*.parquet") if "_delta_log" not in p.parts}


def _age(paths: list[Path], seconds: float) -> None:
    """Make files look ``seconds`` old (their last write), as a long run leaves them."""
    then = time.time() - seconds
    for path in paths:
        os.utime(path, (then, then))


def _files_of(uri: str, version: int) -> set[str]:
    """The names of the files ``version`` of the table reads (as its log says)."""
    return {Path(u).name for u in DeltaTable(uri, version=version).file_uris()}


def test_a_held_version_keeps_its_files_and_log_whatever_their_age(tmp_path: Path) -> None:
    root = tmp_path / "expected"
    writer = _store(root)
    states: dict[int, dict[int, int]] = {}
    _epochs(writer, 0, 9, states)
    writer.compact()  # a base through epoch 8: epoch 2 is read from its own version
    reader = _store(root)
    with reader.holding():
        assert _as_map(reader.snapshot(2)) == states[2]
        held = reader.version_of(2)
        assert held in held_versions(reader.uri)
        needed = _files_of(reader.uri, held)
        # The pipeline moves on: more epochs, a fold, a checkpoint and a vacuum that
        # keeps the last two epochs only, deleting what nothing keeps at once.
        _epochs(writer, 10, 20, states)
        writer.compact()
        writer.checkpoint()
        report = writer.vacuum(keep_epochs=2, retention_hours=0, safety_margin_minutes=0)
        assert held in report.kept_versions
        assert needed <= _data_files(root / "shop" / "orders")
        # Read again, in full, by the same verify: nothing lost mid-read.
        assert _as_map(reader.snapshot(2)) == states[2]
    # Released: the record is gone, and the next vacuum drops the version.
    assert held_versions(writer.uri) == set()
    writer.vacuum(keep_epochs=2, retention_hours=0, safety_margin_minutes=0)
    assert not needed & _data_files(root / "shop" / "orders")
    with pytest.raises(InvalidInputError, match="gone"):
        _store(root).snapshot(2)


def test_a_rebuilds_version_is_kept_while_it_reads_it(tmp_path: Path) -> None:
    root = tmp_path / "expected"
    writer = _store(root)
    states: dict[int, dict[int, int]] = {}
    _epochs(writer, 0, 5, states)
    before = DeltaTable(writer.uri).version()  # what a rebuild compares the new state with
    needed = _files_of(writer.uri, before)
    rebuild = _store(root)
    with rebuild.holding():
        old = rebuild.state_at_version(before)
        # Two folds: the version kept by epoch no longer reads epochs 0..5's own files.
        _epochs(writer, 6, 9, states)
        writer.compact()
        _epochs(writer, 10, 15, states)
        writer.compact()
        writer.checkpoint()
        writer.vacuum(keep_epochs=1, retention_hours=0, safety_margin_minutes=0)
        again = rebuild.state_at_version(before)
    assert _as_map(again) == _as_map(old) == states[5]
    writer.vacuum(keep_epochs=1, retention_hours=0, safety_margin_minutes=0)
    assert not needed & _data_files(root / "shop" / "orders")  # only the hold kept them


def test_every_sink_keeps_the_epochs_from_the_oldest_one_a_sink_lacks(tmp_path: Path) -> None:
    # Two sinks; the commit cycle passes the oldest epoch some sink still lacks
    # (here 3: one sink far behind) to the housekeeping of every sink's table.
    root = tmp_path / "expected"
    expected = ExpectedState(str(root), "shop", {"near": ["k"], "far": ["k"]},
                             retention_hours=0, safety_margin_minutes=0)  # fmt: skip
    states: dict[int, dict[int, int]] = {}
    for e in range(62):
        rows = {k: e * 100 + k for k in range(e % 3, 30, 3)}
        for table in expected.tables.values():
            table.apply(e, pa.table({"k": list(rows), "v": list(rows.values()),
                                     "_op": ["upsert"] * 10}))  # fmt: skip
            if e == 9:
                table.compact_changes()  # an earlier housekeeping's merge of epochs 0..8
        states[e] = {**states.get(e - 1, {}), **rows}
    # A writer that died a minute ago after writing an epoch's file ahead: the
    # pipeline's margin of 0 lets it go (the default, 10 minutes, would keep it).
    ahead = _store(root, "near")
    written = ahead.write_ahead(1_000, ahead.normalize(
        pa.table({"k": [1], "v": [1], "_op": ["upsert"]})))  # fmt: skip
    assert written is not None
    (orphan,) = (root / "shop" / "near" / f.path for f in written.files)
    _age([orphan], 60)
    done = expected.maintain(3)
    assert set(done) == {"near", "far"}
    for sink in ("near", "far"):
        assert "vacuum" in done[sink], done[sink]  # a merge and a vacuum ran
        fresh = _store(root, sink)
        for e in (3, 4, 30, 61):
            assert _as_map(fresh.snapshot(e)) == states[e], (sink, e)
        assert _as_map(fresh.snapshot(3)) == states[3]
        assert set(fresh.changed_keys(3).column("k").to_pylist()) == set(range(30))
    assert not orphan.exists()
    expected.close()


_HOLDER = """
import sys, time
from expected_state.store import ExpectedStateStore
store = ExpectedStateStore(sys.argv[1], "shop", "orders", ["k"])
with store.holding(lease_s=float(sys.argv[2])):
    store.snapshot(2)
    print(store.version_of(2), flush=True)
    time.sleep(600)
"""


def test_a_killed_holders_hold_stops_pinning_after_its_lease(tmp_path: Path) -> None:
    root = tmp_path / "expected"
    writer = _store(root)
    states: dict[int, dict[int, int]] = {}
    _epochs(writer, 0, 9, states)
    writer.compact()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(_HOLDER), str(root), "2"],
                              stdout=subprocess.PIPE, text=True, env=env)  # fmt: skip
    try:
        assert holder.stdout is not None
        held = int(holder.stdout.readline())
        needed = _files_of(writer.uri, held)
        _epochs(writer, 10, 15, states)
        writer.compact()
        writer.vacuum(keep_epochs=1, retention_hours=0, safety_margin_minutes=0)
        assert needed <= _data_files(root / "shop" / "orders")  # held while it lives
        time.sleep(3)  # past its first lease: renewed, still held
        assert held in held_versions(writer.uri)
        os.kill(holder.pid, 9)
        assert holder.wait(WAIT_S) == -9
    finally:
        if holder.poll() is None:
            holder.kill()
    deadline = time.monotonic() + WAIT_S
    while held in held_versions(writer.uri):  # its lease runs out: 2 s
        assert time.monotonic() < deadline, "a killed holder's hold never expired"
        time.sleep(0.2)
    assert not list((root / "shop" / "orders" / HOLDS_DIR).glob("*.json"))  # deleted once expired
    writer.vacuum(keep_epochs=1, retention_hours=0, safety_margin_minutes=0)
    assert not needed & _data_files(root / "shop" / "orders")
    assert _as_map(_store(root).snapshot()) == states[15]


def test_unreferenced_files_go_after_the_margin_and_a_fractional_retention(
    tmp_path: Path,
) -> None:
    root = tmp_path / "expected"
    store = _store(root)
    states: dict[int, dict[int, int]] = {}
    _epochs(store, 0, 3, states)
    table = root / "shop" / "orders"

    def orphan(epoch: int) -> Path:
        # An epoch's file written ahead, not committed (yet): no version references it.
        written = store.write_ahead(epoch, store.normalize(
            pa.table({"k": [1], "v": [epoch], "_op": ["upsert"]})))  # fmt: skip
        assert written is not None
        (path,) = (f.path for f in written.files)
        return table / path

    young, twenty, forty = orphan(100), orphan(101), orphan(102)
    _age([twenty], 20 * 60)
    _age([forty], 40 * 60)
    # The default margin (10 minutes) keeps a file just written; older ones go.
    store.vacuum(retention_hours=0)
    assert young.exists() and not twenty.exists() and not forty.exists()

    twenty, forty = orphan(103), orphan(104)
    _age([twenty], 20 * 60)
    _age([forty], 40 * 60)
    # Half an hour of retention is half an hour, not 0: the 20-minute-old file stays.
    report = store.vacuum(retention_hours=0.5, safety_margin_minutes=0)
    assert twenty.exists() and not forty.exists()
    assert str(forty.relative_to(table)) in report.deleted_files
    assert young.exists()  # 0.5 h of retention covers it too
    store.vacuum(retention_hours=0, safety_margin_minutes=0)
    assert not young.exists() and not twenty.exists()
    assert _as_map(store.snapshot()) == states[3]


def test_the_store_keeps_fewer_bytes_than_under_a_days_retention(tmp_path: Path) -> None:
    root = tmp_path / "expected"
    store = _store(root)
    states: dict[int, dict[int, int]] = {}
    table = root / "shop" / "orders"
    for first in range(0, 40, 10):
        _epochs(store, first, first + 9, states)
        store.maintain(compact_changes_after=5, checkpoint_every=5, keep_from_epoch=first + 8,
                       keep_epochs=2, retention_hours=24)  # fmt: skip
    # An hour later, as a long run leaves the files a merge rewrote an hour ago.
    _age([p for p in table.rglob("*.parquet") if "_delta_log" not in str(p)], 3600)
    store.vacuum(keep_from_epoch=38, keep_epochs=2, retention_hours=24)  # the old schedule
    day = table_disk_use(str(table))
    assert day is not None and day.retained > 0
    store.vacuum(keep_from_epoch=38, keep_epochs=2)  # the new one: margin, no extra retention
    now = table_disk_use(str(table))
    assert now is not None and now.retained == 0
    assert now.total < day.total
    for e in (38, 39):
        assert _as_map(_store(root).snapshot(e)) == states[e]


_MAINTAIN = """
import sys
from expected_state.store import ExpectedStateStore
store = ExpectedStateStore(sys.argv[1], "shop", "orders", ["k"])
store.maintain(compact_changes_after=5, keep_epochs=2, retention_hours=0, safety_margin_minutes=0)
"""


def test_a_kill_mid_vacuum_leaves_a_store_that_reads_whole(tmp_path: Path) -> None:
    root = tmp_path / "expected"
    store = _store(root)
    states: dict[int, dict[int, int]] = {}
    _epochs(store, 0, 19, states)
    store.compact_changes()  # epochs 0..18 in one file: their own files, referenced by
    _epochs(store, 20, 29, states)  # old versions only, go at the next vacuum
    table = root / "shop" / "orders"
    before = _data_files(table)
    fired = tmp_path / "killed"
    env = {**os.environ, "PYTHONPATH": str(REPO), "RECONCILE_KILL_ONCE": str(fired),
           "RECONCILE_KILL_AT": "expected_state.vacuum.deleting:3"}  # fmt: skip
    run = subprocess.run([sys.executable, "-c", textwrap.dedent(_MAINTAIN), str(root)],
                         env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert run.returncode == -9, run.stderr
    assert "expected_state.vacuum.deleting" in fired.read_text()  # the kill fired there
    # Killed between deletions: the merge committed, two old change files deleted,
    # the rest (no longer referenced by a kept version) still there.
    left = _data_files(table)
    assert len(before - left) == 2, before - left
    fresh = _store(root)
    for at in (None, 28, 29):
        assert _as_map(fresh.snapshot(at)) == states[29 if at is None else at]
    # The next maintain() (merges due again) completes and deletes what was left.
    _epochs(fresh, 30, 36, states)
    done = fresh.maintain(compact_changes_after=5, keep_epochs=2, retention_hours=0,
                          safety_margin_minutes=0)  # fmt: skip
    assert "vacuum" in done
    disk = table_disk_use(str(table))
    assert disk is not None and disk.retained == 0
    assert _as_map(_store(root).snapshot()) == states[36]


def test_a_repair_holds_the_store_version_it_reads_until_it_ends(tmp_path: Path) -> None:
    import sqlalchemy as sa

    from reconcile import CommitCycle, CommitSucceeded, recover
    from reconcile.core import hooks
    from reconcile.recovery.engine import PULLED
    from sinks.sql.sink import SqlSink

    url = f"sqlite:///{tmp_path / 'shop.db'}"
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "CREATE TABLE orders (k BIGINT PRIMARY KEY, v BIGINT NOT NULL, _epoch BIGINT NOT NULL)"
        )
    root = tmp_path / "expected"
    expected = ExpectedState(str(root), "shop", {"orders": ["k"]})
    cycle = CommitCycle("shop", [SqlSink(url, "orders", name="orders")], expected_state=expected)
    cycle.start()
    for e in range(3):
        rows = [{"k": k, "v": e * 100 + k} for k in range(e, 20, 3)]
        assert cycle.run_epoch(e, {"orders": rows}) == CommitSucceeded(e)
    cycle.close()
    with engine.begin() as conn:
        conn.exec_driver_sql("DELETE FROM orders WHERE k = 2")  # drift for the repair
    uri = _store(root).uri
    seen: list[set[int]] = []
    # Between its pull and its repair: the store version it diffed with is held.
    with hooks.at(PULLED, lambda: seen.append(held_versions(uri))) as armed:
        report = recover(url, str(root), "shop", "orders")
    assert armed.fired == 1
    assert seen == [{DeltaTable(uri).version()}]
    assert report.missing == 1 and report.applied == 1
    assert held_versions(uri) == set()  # released when it ended
