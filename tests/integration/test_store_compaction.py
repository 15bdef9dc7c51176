"""compact() off the write path: the other party put inside its windows, at named points.

An apply, a revert or a takeover lands between compaction's long part (the new
base is written) and its commit, or inside its commit; the Delta table is then
checked: which commits it holds, which files are live, what every epoch reads.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from expected_state.compaction import COMPACT_WRITTEN
from expected_state.delta_commit import BEFORE_WRITE
from expected_state.store import APPLY_CHECKED, ExpectedStateStore
from reconcile.core import hooks
from reconcile.core.contract import Change, FencedError, InvalidInputError, RetryableError

pytestmark = pytest.mark.integration

SCHEMA = pa.schema([("k", pa.string()), ("v", pa.int64())])


def store_at(root: Path, generation: int = 0) -> ExpectedStateStore:
    return ExpectedStateStore(str(root), "pipe", "t", ["k"], schema=SCHEMA, generation=generation)


def as_map(table: pa.Table) -> dict[str, int]:
    return {r["k"]: r["v"] for r in table.to_pylist()}


def epoch_changes(e: int) -> list[Change]:
    upsert = Change("upsert", {"k": f"k{e % 4}", "v": e})
    return [upsert, Change("delete", {"k": f"k{(e + 2) % 4}"})]


def build(root: Path, epochs: int) -> tuple[ExpectedStateStore, dict[int, dict[str, int]]]:
    store = store_at(root)
    states = {}
    for e in range(1, epochs + 1):
        store.apply(e, epoch_changes(e))
        states[e] = as_map(store.snapshot())
    return store, states


def commits(store: ExpectedStateStore) -> list[dict[str, object]]:
    return list(reversed(DeltaTable(store.uri).history()))


def compactions(store: ExpectedStateStore) -> list[int]:
    """The epoch each compaction commit folded through, oldest first."""
    key = "reconcile.compacted_through"
    return [int(str(c[key])) for c in commits(store) if key in c]


def live_kinds(store: ExpectedStateStore) -> list[str]:
    return sorted(Path(u).name.split("-")[0] for u in DeltaTable(store.uri).file_uris())


def test_compaction_folds_every_epoch_but_the_newest_and_changes_no_snapshot(
    tmp_path: Path,
) -> None:
    store, states = build(tmp_path, 8)
    report = store.compact()
    assert report["through_epoch"] == 7 and report["folded_epochs"] == 7
    assert live_kinds(store) == ["base", "change"]
    for e, state in states.items():
        assert as_map(store.snapshot(e)) == state
    # The commit says "no data change" in the log itself: its adds and removes
    # rearrange rows that mean the same state.
    version = DeltaTable(store.uri).version()
    log = Path(store.uri) / "_delta_log" / f"{version:020d}.json"
    actions = [json.loads(line) for line in log.read_text().splitlines()]
    flags = [a[k]["dataChange"] for a in actions for k in ("add", "remove") if k in a]
    assert flags and not any(flags)


def test_an_apply_landing_while_compaction_works_stays(tmp_path: Path) -> None:
    store, states = build(tmp_path, 6)
    writer = store_at(tmp_path)

    def apply_next() -> None:
        assert writer.apply(7, epoch_changes(7)).applied

    with hooks.at(COMPACT_WRITTEN, apply_next) as window:
        store.compact()
    assert window.fired == 1
    assert compactions(store) == [5]
    states[7] = {**states[6], "k3": 7}
    states[7].pop("k1", None)
    for e, state in states.items():
        assert as_map(store.snapshot(e)) == state
    assert live_kinds(store) == ["base", "change", "change"]


def test_an_apply_inside_the_compaction_commit_makes_compaction_retry(tmp_path: Path) -> None:
    # Both commits carry the writer's fence token, so the compaction's commit
    # conflicts; it checks the table again and commits on the newer snapshot.
    store, states = build(tmp_path, 6)
    writer = store_at(tmp_path)
    with hooks.at(BEFORE_WRITE, lambda: writer.apply(7, epoch_changes(7))) as window:
        store.compact()
    assert window.fired == 1
    assert compactions(store) == [5]
    assert [c.get("reconcile.epoch") for c in commits(store)][-2] == 7  # the apply went first
    assert as_map(store.snapshot(6)) == states[6]
    assert store.last_epoch() == 7


def test_a_compaction_inside_the_apply_window_makes_apply_retry(tmp_path: Path) -> None:
    store, states = build(tmp_path, 6)
    housekeeper = store_at(tmp_path)
    with hooks.at(APPLY_CHECKED, housekeeper.compact) as window:
        result = store.apply(7, epoch_changes(7))
    assert window.fired == 1
    assert result.applied and store.last_epoch() == 7
    assert compactions(store) == [5]
    epochs = [c.get("reconcile.epoch") for c in commits(store) if "reconcile.epoch" in c]
    assert epochs == list(range(1, 8))  # epoch 7 recorded exactly once
    assert as_map(store.snapshot(6)) == states[6]


def test_a_revert_of_a_folded_epoch_in_the_window_stops_the_compaction(tmp_path: Path) -> None:
    store, states = build(tmp_path, 6)
    other = store_at(tmp_path)
    before = DeltaTable(store.uri).version()
    with (
        hooks.at(COMPACT_WRITTEN, lambda: other.revert(6)) as window,
        pytest.raises(RetryableError, match="changed under compaction"),
    ):
        store.compact(through_epoch=6)
    assert window.fired == 1
    assert compactions(store) == []  # nothing was committed but the revert
    assert DeltaTable(store.uri).version() == before + 1
    assert "base" not in live_kinds(store)
    assert as_map(store.snapshot()) == states[5]


def test_a_takeover_in_the_compaction_window_fences_it(tmp_path: Path) -> None:
    store = store_at(tmp_path, 1)
    store.claim()
    for e in range(1, 5):
        store.apply(e, epoch_changes(e))
    successor = store_at(tmp_path, 2)
    with hooks.at(COMPACT_WRITTEN, successor.claim) as window, pytest.raises(FencedError):
        store.compact()
    assert window.fired == 1
    assert compactions(store) == []
    assert DeltaTable(store.uri).transaction_version("pipe/t#generation") == 2


def test_merging_changes_leaves_the_base_alone_and_every_epoch_readable(tmp_path: Path) -> None:
    store, states = build(tmp_path, 4)
    store.compact()  # base through 3, epoch 4 on its own
    base = [u for u in DeltaTable(store.uri).file_uris() if Path(u).name.startswith("base-")]
    for e in range(5, 10):
        store.apply(e, epoch_changes(e))
        states[e] = as_map(store.snapshot())
    report = store.compact_changes()  # epochs 4..8 into one file; 9 keeps its own
    assert report["merged_files"] == 5
    names = sorted(Path(u).name for u in DeltaTable(store.uri).file_uris())
    assert [
        u for u in DeltaTable(store.uri).file_uris() if Path(u).name.startswith("base-")
    ] == base
    assert [n.split("-")[:3] for n in names if n.startswith("change-")] == [
        ["change", "e000000000004", "e000000000008"],
        ["change", "e000000000009", names[-1].split("-")[2]],
    ]
    for e, state in states.items():
        assert as_map(store.snapshot(e)) == state
    assert [r["k"] for r in store.changes_of(6).to_pylist()] == ["k2", "k0"]
    assert {r["k"] for r in store.changed_keys(6).to_pylist()} == {"k3", "k1", "k0", "k2"}
    # Epoch 9's 2 rows wait for the 4 of the merged file (runs are tiered by size);
    # with epoch 10's they add up to it, and the three merge into one file.
    store.apply(10, epoch_changes(10))
    states[10] = as_map(store.snapshot())
    report = store.compact_changes(through_epoch=10)  # 10 is merged too: no file of its own
    assert report["merged_files"] == 3
    with pytest.raises(InvalidInputError, match="can no longer be reverted"):
        store.revert(10)
    assert store.last_epoch() == 10
    for e, state in states.items():
        assert as_map(store.snapshot(e)) == state


def test_an_apply_landing_while_changes_merge_stays(tmp_path: Path) -> None:
    store, states = build(tmp_path, 6)
    writer = store_at(tmp_path)
    with hooks.at(COMPACT_WRITTEN, lambda: writer.apply(7, epoch_changes(7))) as window:
        store.compact_changes()
    assert window.fired == 1
    merged = [
        c["reconcile.merged_through"] for c in commits(store) if "reconcile.merged_through" in c
    ]
    assert merged == [5]
    for e, state in states.items():
        assert as_map(store.snapshot(e)) == state
    assert store.changes_of(7).num_rows == 2 and store.revert(7)
