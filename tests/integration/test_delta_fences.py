"""Fence windows on Delta tables: a takeover put exactly inside each window, at a named point.

Each test runs the "other party" (a newer writer generation, or a second
writer of the same epoch) at a hook point inside the window, then checks the
Delta table itself: which commits it holds, what the fence token says, which
rows are visible.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from expected_state.delta_commit import BEFORE_WRITE
from expected_state.delta_log import transaction_version
from expected_state.fencing import fence_app_id
from expected_state.store import APPLY_CHECKED, APPLY_TABLE_MISSING, ExpectedStateStore
from reconcile.core import hooks
from reconcile.core.contract import OK, Change, FencedError, SinkTxnId
from reconcile.testing.harness import rows_for
from sinks.delta.sink import COMMIT_CHECKED, DeltaSink
from tests.fix_delta import DeltaHarness

pytestmark = pytest.mark.integration

FENCE = fence_app_id("pipe", "out")


def txn(epoch: int, generation: int) -> SinkTxnId:
    return SinkTxnId("pipe", "out", epoch, generation)


def prepare(sink: DeltaSink, epoch: int, generation: int) -> SinkTxnId:
    t = txn(epoch, generation)
    assert sink.stage(t, rows_for(epoch)) == OK
    assert sink.prepare(t) == OK
    return t


def fence_of(uri: str) -> int | None:
    return DeltaTable(uri).transaction_version(FENCE)


@pytest.mark.parametrize("window", [COMMIT_CHECKED, BEFORE_WRITE])
def test_delta_sink_zombie_commit_with_takeover_in_the_window(tmp_path: Path, window: str) -> None:
    harness = DeltaHarness(tmp_path)
    zombie = harness.new_sink("out")
    assert zombie.commit(prepare(zombie, 0, 1)) == OK
    stale = prepare(zombie, 1, 1)

    def takeover() -> None:
        # A newer writer prepares epoch 2: its prepare records generation 2.
        prepare(harness.new_sink("out"), 2, 2)

    with hooks.at(window, takeover) as armed:
        outcome = zombie.commit(stale)
    assert armed.fired == 1
    assert not outcome and isinstance(outcome.error, FencedError), outcome
    # The Delta table itself: the zombie's epoch is not visible, the fence was not lowered.
    assert harness.committed("out") == {0: rows_for(0)}
    assert fence_of(zombie.uri) == 2
    assert DeltaTable(zombie.uri).transaction_version("pipe/out") == 0


def test_delta_sink_zombie_whose_snapshot_already_holds_the_takeover(tmp_path: Path) -> None:
    harness = DeltaHarness(tmp_path)
    zombie = harness.new_sink("out")
    assert zombie.commit(prepare(zombie, 0, 1)) == OK
    stale = prepare(zombie, 1, 1)
    prepare(harness.new_sink("out"), 2, 2)  # the takeover lands before the zombie's commit
    outcome = zombie.commit(stale)
    assert not outcome and isinstance(outcome.error, FencedError), outcome
    assert harness.committed("out") == {0: rows_for(0)}
    assert fence_of(zombie.uri) == 2


def store(root: Path, generation: int) -> ExpectedStateStore:
    schema = pa.schema([("k", pa.string()), ("v", pa.int64())])
    return ExpectedStateStore(str(root), "pipe", "out", ["k"], schema=schema, generation=generation)


def epoch_commits(uri: str) -> list[int]:
    return sorted(c["reconcile.epoch"] for c in DeltaTable(uri).history() if "reconcile.epoch" in c)


@pytest.mark.parametrize("window", [APPLY_CHECKED, BEFORE_WRITE])
def test_store_zombie_apply_with_takeover_in_the_window(tmp_path: Path, window: str) -> None:
    zombie = store(tmp_path, 1)
    zombie.claim()
    assert zombie.apply(0, [Change("upsert", {"k": "a", "v": 0})]).applied
    successor = store(tmp_path, 2)

    with hooks.at(window, successor.claim) as armed, pytest.raises(FencedError):
        zombie.apply(1, [Change("upsert", {"k": "zombie", "v": 1})])
    assert armed.fired == 1
    table = DeltaTable(zombie.uri)
    assert table.transaction_version(FENCE) == 2  # never lowered
    assert epoch_commits(zombie.uri) == [0]
    assert pa.table(table.to_pyarrow_table()).column("k").to_pylist() == ["a"]
    # The successor goes on from the zombie's last epoch.
    assert successor.apply(1, [Change("upsert", {"k": "b", "v": 1})]).applied


def test_store_writer_that_found_no_table_rechecks_after_creating_it(tmp_path: Path) -> None:
    # Writer A looks, finds no table; writer B creates it and records epochs 1..3;
    # A then creates (a no-op) and must see that epoch 1 is in, not apply it again.
    late, early = store(tmp_path, 0), store(tmp_path, 0)

    def other_writer_runs_ahead() -> None:
        for e in (1, 2, 3):
            assert early.apply(e, [Change("upsert", {"k": f"e{e}", "v": e})]).applied

    with hooks.at(APPLY_TABLE_MISSING, other_writer_runs_ahead) as armed:
        result = late.apply(1, [Change("upsert", {"k": "e1", "v": 1})])
    assert armed.fired == 1
    assert not result.applied
    assert epoch_commits(late.uri) == [1, 2, 3]
    assert DeltaTable(late.uri).transaction_version("pipe/out") == 3  # not moved back to 1


def test_a_claim_never_lowers_the_fence(tmp_path: Path) -> None:
    newer = store(tmp_path, 5)
    newer.claim()
    with pytest.raises(FencedError, match="generation 3 is fenced off by generation 5"):
        store(tmp_path, 3).claim()
    assert DeltaTable(newer.uri).transaction_version(FENCE) == 5


def test_commit_files_fsyncs_the_commit_before_returning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # deltalake links the commit file into _delta_log without any fsync (seen
    # with strace on deltalake 1.6.6); commit_files must make it durable itself.
    import expected_state.delta_commit as delta_commit

    synced: list[str] = []
    real = delta_commit.fsync_path
    monkeypatch.setattr(delta_commit, "fsync_path", lambda p: (synced.append(str(p)), real(p)))
    s = store(tmp_path, 0)
    assert s.apply(0, [Change("upsert", {"k": "a", "v": 0})]).applied
    log = Path(s.uri) / "_delta_log"
    version = DeltaTable(s.uri).version()
    assert str(log / f"{version:020d}.json") in synced
    assert str(log / f"{0:020d}.json") in synced  # the table's creation too
    assert str(log) in synced


def test_a_store_writer_sees_a_takeover_on_its_next_snapshot(tmp_path: Path) -> None:
    # The zombie read its fence on an older snapshot of the same table object;
    # the takeover lands between its epochs, and its next apply must see it.
    zombie = store(tmp_path, 1)
    zombie.claim()
    assert zombie.apply(0, [Change("upsert", {"k": "a", "v": 0})]).applied
    store(tmp_path, 2).claim()
    with pytest.raises(FencedError, match="generation 1 is fenced off by generation 2"):
        zombie.apply(1, [Change("upsert", {"k": "zombie", "v": 1})])
    assert DeltaTable(zombie.uri).transaction_version(FENCE) == 2
    assert epoch_commits(zombie.uri) == [0]


def test_a_transaction_version_is_read_again_once_the_snapshot_moves(tmp_path: Path) -> None:
    writer = store(tmp_path, 1)
    writer.claim()
    table = DeltaTable(writer.uri)
    assert transaction_version(table, FENCE) == 1
    store(tmp_path, 4).claim()
    assert transaction_version(table, FENCE) == 1  # the same snapshot, the same answer
    table.update_incremental()
    assert transaction_version(table, FENCE) == 4
    assert transaction_version(table, "no such app") is None
