"""An epoch's change file written ahead of its commit: invisible until then, fenced as ever.

The commit cycle writes each table's change file while the sinks prepare the
epoch (``ExpectedStateStore.write_ahead``), and the commit point only adds it
(``apply``). Each test checks the table on disk: its log, its files, what a
fresh reader sees.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from expected_state.epoch_file import EpochFile
from expected_state.reading import live_files
from expected_state.store import ExpectedStateStore
from reconcile import CommitAborted, CommitCycle, CommitSucceeded
from reconcile.core.contract import FencedError, InvalidInputError
from reconcile.engine.expected import ExpectedState
from reconcile.engine.faults import Fault, FaultKind, FaultPlan
from sinks.memory import MemorySink, MemoryStore

pytestmark = [pytest.mark.integration]

SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.int64())])


def _changes(keys: list[int], value: int) -> pa.Table:
    return pa.table({"k": pa.array(keys, pa.int64()), "v": pa.array([value] * len(keys)),
                     "_op": ["upsert"] * len(keys)})  # fmt: skip


def _store(root: Path, generation: int = 0) -> ExpectedStateStore:
    return ExpectedStateStore(str(root), "pipe", "out", ["k"], schema=SCHEMA,
                              generation=generation)  # fmt: skip


def _on_disk(uri: str, written: EpochFile) -> bool:
    return all((Path(uri) / f.path).exists() for f in written.files)


def _values(store: ExpectedStateStore) -> dict[int, int]:
    return {r["k"]: r["v"] for r in store.snapshot(columns=["k", "v"]).to_pylist()}


def test_a_file_written_ahead_is_invisible_until_apply_commits_that_very_file(
    tmp_path: Path,
) -> None:
    store = _store(tmp_path)
    store.apply(0, _changes([1, 2], 0))
    written = store.write_ahead(1, store.normalize(_changes([2, 3], 1)))
    assert written is not None and len(written.files) == 1 and _on_disk(store.uri, written)
    fresh = _store(tmp_path)
    assert fresh.last_epoch() == 0 and _values(fresh) == {1: 0, 2: 0}  # not in the table yet
    assert store.apply(1, written).applied
    table = _store(tmp_path)._delta()
    assert table is not None
    paths = {f.path.rsplit("/", 1)[-1] for f in live_files(table, name=store.uri) if f.epoch == 1}
    assert paths == {written.files[0].path.rsplit("/", 1)[-1]}  # that file, no other
    assert _values(_store(tmp_path)) == {1: 0, 2: 1, 3: 1}


def test_nothing_is_written_ahead_for_a_table_that_does_not_exist_yet(tmp_path: Path) -> None:
    store = _store(tmp_path)
    assert store.write_ahead(0, store.normalize(_changes([1], 0))) is None
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").rglob("*.parquet"))


def test_a_file_written_for_another_epoch_is_refused_and_nothing_is_committed(
    tmp_path: Path,
) -> None:
    store = _store(tmp_path)
    store.apply(0, _changes([1], 0))
    written = store.write_ahead(1, store.normalize(_changes([2], 1)))
    assert written is not None
    with pytest.raises(InvalidInputError, match="epoch 1's, not epoch 2's"):
        store.apply(2, written, allow_gap=True)
    assert _store(tmp_path).last_epoch() == 0


def test_a_takeover_after_the_file_was_written_fences_its_commit(tmp_path: Path) -> None:
    zombie = _store(tmp_path, generation=1)
    zombie.apply(0, _changes([1], 0))
    written = zombie.write_ahead(1, zombie.normalize(_changes([1, 2], 1)))
    assert written is not None
    _store(tmp_path, generation=2).claim()  # a successor takes over in between
    with pytest.raises(FencedError):
        zombie.apply(1, written)
    fresh = _store(tmp_path)
    assert fresh.last_epoch() == 0 and _values(fresh) == {1: 0}


def _cycle(tmp_path: Path, faults: FaultPlan | None = None) -> tuple[CommitCycle, ExpectedState]:
    expected = ExpectedState(str(tmp_path / "expected"), "pipe", {"out": ["k"]},
                             schemas={"out": SCHEMA})  # fmt: skip
    cycle = CommitCycle("pipe", [MemorySink("out", MemoryStore())], expected_state=expected,
                        faults=faults)  # fmt: skip
    cycle.start()
    return cycle, expected


def _parquet_files(root: Path) -> set[str]:
    return {p.name for p in (root / "expected").rglob("change-*.parquet")}


def test_an_aborted_epoch_leaves_no_file_written_ahead(tmp_path: Path) -> None:
    plan = FaultPlan([Fault("cycle.prepare", FaultKind.RETRYABLE, nth=2)])
    cycle, _ = _cycle(tmp_path, plan)
    assert cycle.run_epoch(0, {"out": [{"k": 1, "v": 0}]}) == CommitSucceeded(0)
    before = _parquet_files(tmp_path)
    result = cycle.run_epoch(1, {"out": [{"k": 2, "v": 1}]})
    assert isinstance(result, CommitAborted)
    assert plan.log, "the planned fault did not fire"
    assert _parquet_files(tmp_path) == before  # epoch 1's file, written ahead, removed
    assert cycle.run_epoch(1, {"out": [{"k": 2, "v": 1}]}) == CommitSucceeded(1)
    cycle.close()


def test_a_committed_file_written_ahead_outlives_the_cycle_that_wrote_it(tmp_path: Path) -> None:
    cycle, _ = _cycle(tmp_path)
    for epoch in range(3):
        assert cycle.run_epoch(epoch, {"out": [{"k": epoch, "v": epoch}]}) == CommitSucceeded(epoch)
    cycle.close()  # discards what was never committed, and nothing else
    store = ExpectedStateStore(str(tmp_path / "expected"), "pipe", "out", ["k"])
    assert _values(store) == {0: 0, 1: 1, 2: 2}
