"""Housekeeping killed with SIGKILL mid-merge and mid-vacuum, while a sink is behind.

A pipeline's housekeeping runs ``maintain(keep_from_epoch=...)`` with the oldest
epoch some sink still lacks: every epoch from there on must stay readable,
whatever point a kill stops the merge or the vacuum at, and the next
``maintain()`` must finish the work without deleting a file those epochs read.
Each kill is a real one (a subprocess, ``RECONCILE_KILL_AT``), asserted to have
fired at its point; what is kept is read back from the Delta table on disk.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from expected_state.disk_use import table_disk_use
from expected_state.store import ExpectedStateStore

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.int64())])
BEHIND = 12  # the oldest epoch a sink lacks: from here on, every epoch must stay readable

_MAINTAIN = f"""
import sys
from expected_state.store import ExpectedStateStore
store = ExpectedStateStore(sys.argv[1], "shop", "orders", ["k"])
store.maintain(compact_changes_after=5, keep_from_epoch={BEHIND}, keep_epochs=2,
               retention_hours=0, safety_margin_minutes=0)
"""


def _store(root: Path) -> ExpectedStateStore:
    return ExpectedStateStore(str(root), "shop", "orders", ["k"], schema=SCHEMA)


def _filled(root: Path, epochs: range, states: dict[int, dict[int, int]]) -> None:
    """Apply ``epochs``, each updating a third of 30 keys (merged at 9 and 12), into ``states``."""
    store = _store(root)
    state: dict[int, int] = dict(states[max(states)]) if states else {}
    for e in epochs:
        rows = {k: e * 100 + k for k in range(e % 3, 30, 3)}
        store.apply(
            e, pa.table({"k": list(rows), "v": list(rows.values()), "_op": ["upsert"] * 10})
        )
        state.update(rows)
        states[e] = dict(state)
        if e in (9, BEHIND):
            # Earlier housekeeping's merges, of epochs 0..8 and of 9..11. The own files of
            # 0..8 are read only by versions older than the sink behind's: the vacuum
            # deletes them. Those of 9..11 are read by the sink behind's own version,
            # and by no later one: they must stay.
            store.compact_changes()


def _maintain(root: Path, tmp_path: Path, kill_at: str | None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    if kill_at is not None:
        env |= {"RECONCILE_KILL_AT": kill_at, "RECONCILE_KILL_ONCE": str(tmp_path / "killed")}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(_MAINTAIN), str(root)],
                          env=env, capture_output=True, text=True, timeout=120)  # fmt: skip


def _reads_whole(root: Path, states: dict[int, dict[int, int]]) -> None:
    """Every epoch from the sink behind on reads its own state, from a fresh reader."""
    fresh = _store(root)
    for e in range(BEHIND, max(states) + 1):
        table = fresh.snapshot(e)
        got = dict(zip(*(table.column(c).to_pylist() for c in ("k", "v")), strict=True))
        assert got == states[e], e
    # Scoped recovery from the sink behind reads the keys changed since it.
    assert set(fresh.changed_keys(BEHIND).column("k").to_pylist()) == set(range(30))


def _data_files(table: Path) -> set[str]:
    return {p.name for p in table.rglob("*.parquet") if "_delta_log" not in p.parts}


@pytest.mark.parametrize(
    "point",
    [
        "expected_state.compact.written:1",  # the merged file written, its commit not made
        "expected_state.vacuum.deleting:1",  # the merge committed, before the first delete
        "expected_state.vacuum.deleting:3",  # between two deletes
    ],
)
def test_a_kill_mid_housekeeping_keeps_every_epoch_a_sink_behind_needs(
    tmp_path: Path, point: str
) -> None:
    root = tmp_path / "expected"
    states: dict[int, dict[int, int]] = {}
    _filled(root, range(30), states)
    table = root / "shop" / "orders"
    before = DeltaTable(str(table)).version()
    killed = _maintain(root, tmp_path, point)
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert point.split(":")[0] in (tmp_path / "killed").read_text()  # the kill fired there
    if point.startswith("expected_state.compact"):
        assert DeltaTable(str(table)).version() == before  # the merge never committed
    _reads_whole(root, states)
    # Six epochs later a merge is due again (a vacuum runs after a merge): the next
    # maintain() merges and vacuums; the sink-behind epochs stay whole, and what no kept
    # version reads (the killed merge's file, the change files merged away before the
    # sink behind's epoch) is gone.
    _filled(root, range(30, 36), states)
    finished = _maintain(root, tmp_path, None)
    assert finished.returncode == 0, finished.stderr[-2000:]
    _reads_whole(root, states)
    disk = table_disk_use(str(table))
    assert disk is not None and disk.retained == 0, disk
    # The single-epoch files of epochs 0..8, merged away before the sink behind's epoch,
    # are read by no kept version: gone. Those of the kept epochs are all still there.
    own = {name for name in _data_files(table) if re.match(r"change-e\d{12}-[0-9a-f]{32}", name)}
    assert {int(name[8:20]) for name in own} == set(range(9, 36))
