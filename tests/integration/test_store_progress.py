"""The store's epochs table as a progress log: ordering by commit, identity, fencing, compaction.

Every check reads the ``_epochs`` Delta table itself (its rows, versions and
tokens through deltalake), not the log object's own bookkeeping.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from expected_state.delta_commit import BEFORE_WRITE
from expected_state.epoch_rows import APPEND_CHECKED, EPOCHS_TABLE
from expected_state.epochs import EpochLog
from expected_state.progress_log import StoreProgressLog, progress_fence_id
from reconcile.core import hooks
from reconcile.core.contract import FatalError, FencedError
from reconcile.core.progress import EpochStatus

pytestmark = pytest.mark.integration

D, C, F, A = (
    EpochStatus.DECIDED,
    EpochStatus.COMMITTED,
    EpochStatus.FINALIZED,
    EpochStatus.ABORTED,
)


def epochs_uri(root: Path) -> str:
    return str(root / EPOCHS_TABLE)


def raw_rows(root: Path, pipeline: str = "pipe", sink: str = "*") -> list[dict[str, object]]:
    """The stream's rows as deltalake reads them, in commit order."""
    data = pa.table(DeltaTable(epochs_uri(root)).to_pyarrow_table())
    rows = [r for r in data.to_pylist() if r["pipeline"] == pipeline and r["sink"] == sink]
    return sorted(rows, key=lambda r: r["seq"])


def newest_status(root: Path, epoch: int, pipeline: str = "pipe", sink: str = "*") -> object:
    """An epoch's status by the table's own rule: its row with the highest seq."""
    rows = [r for r in raw_rows(root, pipeline, sink) if r["epoch"] == epoch]
    return rows[-1]["status"] if rows else None


def version(root: Path) -> int:
    return DeltaTable(epochs_uri(root)).version()


# -- EpochLog: the order is the commit order, not the epoch's number ------------


def test_epoch_log_moves_an_older_epoch_again(tmp_path: Path) -> None:
    # The status tokens used to be high-water marks per status: once epoch 2 was
    # "decided", deciding epoch 1 again (after it was aborted) was a silent no-op.
    log = EpochLog(str(tmp_path), "pipe", "orders")
    assert log.record(1, "decided")
    assert log.record(2, "decided")
    assert log.record(1, "aborted")
    assert log.record(1, "decided")  # the retry of epoch 1
    assert log.record(5, "committed")
    assert log.record(4, "committed")  # an older epoch, recorded later
    assert not log.record(4, "committed")  # the same status again: a no-op
    fresh = EpochLog(str(tmp_path), "pipe", "orders")
    assert fresh.status(1) == "decided" and fresh.status(4) == "committed"
    assert newest_status(tmp_path, 1, sink="orders") == "decided"
    assert newest_status(tmp_path, 4, sink="orders") == "committed"
    statuses = [(r["epoch"], r["status"]) for r in raw_rows(tmp_path, sink="orders")]
    assert statuses == [
        (1, "decided"),
        (2, "decided"),
        (1, "aborted"),
        (1, "decided"),
        (5, "committed"),
        (4, "committed"),
    ]


def test_epoch_log_zombie_with_takeover_in_the_window_records_nothing(tmp_path: Path) -> None:
    zombie = EpochLog(str(tmp_path), "pipe", "orders", generation=1)
    zombie.claim()
    zombie.record(1, "decided")
    successor = EpochLog(str(tmp_path), "pipe", "orders", generation=2)
    with hooks.at(APPEND_CHECKED, successor.claim) as window, pytest.raises(FencedError):
        zombie.record(1, "committed")
    assert window.fired == 1
    assert newest_status(tmp_path, 1, sink="orders") == "decided"
    assert DeltaTable(epochs_uri(tmp_path)).transaction_version("pipe/orders#generation") == 2


# -- StoreProgressLog ------------------------------------------------------------


def test_a_retried_epoch_moves_from_aborted_to_decided(tmp_path: Path) -> None:
    log = StoreProgressLog(str(tmp_path), "pipe")
    gen = log.claim_generation()
    for epoch, status in [(1, D), (2, D), (1, A), (2, C), (1, D), (1, C)]:
        log.mark(epoch, status, gen)
    assert newest_status(tmp_path, 1) == "committed"
    assert newest_status(tmp_path, 2) == "committed"
    fresh = StoreProgressLog(str(tmp_path), "pipe")
    assert fresh.status(1) is C and fresh.epochs_in(C) == [1, 2]


def test_log_id_is_the_epochs_tables_identity(tmp_path: Path) -> None:
    log = StoreProgressLog(str(tmp_path), "pipe")
    log_id = log.log_id
    assert log_id == DeltaTable(epochs_uri(tmp_path)).metadata().id
    gen = log.claim_generation()
    for e in range(12):  # past a checkpoint: the identity is the table's, not a row's
        log.mark(e, D, gen)
    assert StoreProgressLog(str(tmp_path), "pipe").log_id == log_id
    assert StoreProgressLog(str(tmp_path / "other"), "pipe").log_id != log_id


def test_mark_many_is_one_commit_and_all_or_nothing(tmp_path: Path) -> None:
    log = StoreProgressLog(str(tmp_path), "pipe")
    gen = log.claim_generation()
    log.mark_many([(0, D), (0, C)], gen)
    before = version(tmp_path)
    log.mark_many([(1, D), (1, C), (0, F)], gen)  # "committed 1, finalized up to 0"
    assert version(tmp_path) == before + 1
    assert [newest_status(tmp_path, e) for e in (0, 1)] == ["finalized", "committed"]
    with pytest.raises(FatalError, match="epoch 3 cannot move from unrecorded to committed"):
        log.mark_many([(2, D), (3, C)], gen)
    assert version(tmp_path) == before + 1  # the legal first move was not written either
    assert newest_status(tmp_path, 2) is None
    log.mark_many([(1, C), (0, F)], gen)  # already there: no commit at all
    assert version(tmp_path) == before + 1


def test_a_batch_that_takes_a_committed_epoch_back_writes_nothing(tmp_path: Path) -> None:
    log = StoreProgressLog(str(tmp_path), "pipe")
    gen = log.claim_generation()
    log.mark_many([(0, D), (0, C)], gen)
    before = version(tmp_path)
    # A later move in the same batch sees the earlier ones: aborting an epoch
    # this very batch committed is refused too, and so is the whole batch.
    for batch in ([(1, D), (0, A)], [(1, D), (1, C), (1, A)]):
        with pytest.raises(FatalError, match="cannot move from committed to aborted"):
            log.mark_many(batch, gen)
    assert version(tmp_path) == before  # no commit in the _epochs table
    assert [newest_status(tmp_path, e) for e in (0, 1)] == ["committed", None]


def test_zombie_mark_with_takeover_in_the_window_writes_nothing(tmp_path: Path) -> None:
    zombie = StoreProgressLog(str(tmp_path), "pipe")
    gen = zombie.claim_generation()
    zombie.mark(0, D, gen)
    successor = StoreProgressLog(str(tmp_path), "pipe")
    new_gen: list[int] = []
    with (
        hooks.at(APPEND_CHECKED, lambda: new_gen.append(successor.claim_generation())) as window,
        pytest.raises(FencedError, match=f"writer generation {gen} is fenced off"),
    ):
        zombie.mark(0, C, gen)
    assert window.fired == 1
    assert newest_status(tmp_path, 0) == "decided"  # the zombie's commit point is not there
    table = DeltaTable(epochs_uri(tmp_path))
    assert table.transaction_version(progress_fence_id("pipe")) == new_gen[0] == gen + 1
    successor.mark(0, A, new_gen[0])
    assert StoreProgressLog(str(tmp_path), "pipe").status(0) is A


def test_an_identical_mark_landing_first_makes_ours_a_no_op(tmp_path: Path) -> None:
    # Two objects of the same writer mark the same move; the one that loses the
    # race reads the log again and finds its move in: one row, no error.
    log = StoreProgressLog(str(tmp_path), "pipe")
    gen = log.claim_generation()
    log.mark(0, D, gen)
    twin = StoreProgressLog(str(tmp_path), "pipe")
    with hooks.at(BEFORE_WRITE, lambda: twin.mark(0, C, gen)) as window:
        log.mark(0, C, gen)
    assert window.fired == 1
    assert [r["status"] for r in raw_rows(tmp_path) if r["epoch"] == 0] == ["decided", "committed"]
    assert log.status(0) is C


def test_concurrent_claims_get_different_generations(tmp_path: Path) -> None:
    first, second = StoreProgressLog(str(tmp_path), "pipe"), StoreProgressLog(str(tmp_path), "pipe")
    first.claim_generation()
    other: list[int] = []
    with hooks.at(BEFORE_WRITE, lambda: other.append(second.claim_generation())) as window:
        mine = first.claim_generation()
    assert window.fired == 1
    assert mine != other[0] and {mine, other[0]} == {2, 3}
    assert DeltaTable(epochs_uri(tmp_path)).transaction_version(progress_fence_id("pipe")) == 3


def test_pipelines_and_sink_logs_share_the_table_without_mixing(tmp_path: Path) -> None:
    a, b = StoreProgressLog(str(tmp_path), "a"), StoreProgressLog(str(tmp_path), "b")
    sink_log = EpochLog(str(tmp_path), "a", "orders")
    ga, gb = a.claim_generation(), b.claim_generation()
    a.mark(0, D, ga)
    b.mark(0, D, gb)
    b.mark(0, A, gb)
    sink_log.record(0, "committed")
    assert a.status(0) is D and b.status(0) is A and sink_log.status(0) == "committed"
    assert ga == gb == 1  # each pipeline has its own fence
    assert a.log_id == b.log_id  # one table, one identity; the pipeline name tells them apart


def test_the_log_compacts_itself_and_keeps_what_recovery_needs(tmp_path: Path) -> None:
    log = StoreProgressLog(str(tmp_path), "pipe", compact_after_files=10, keep_epochs=3)
    gen = log.claim_generation()
    for e in range(0, 20):
        log.mark_many([(e, D), (e, C)], gen)
        if e == 7:
            continue  # epoch 7 stays committed, never finalized
        log.mark(e, F, gen)
    files = [
        Path(u).name
        for u in DeltaTable(epochs_uri(tmp_path)).file_uris()
        if Path(u).name.split("-")[1:3] == ["pipe", ""]
    ]
    assert len(files) < 10, files  # it compacted: 39 commits of rows otherwise
    fresh = StoreProgressLog(str(tmp_path), "pipe")
    assert fresh.last_committed() == 19
    assert fresh.status(7) is C and fresh.committed_by(7) == gen
    assert [fresh.status(e) for e in (17, 18, 19)] == [F, F, F]
    assert fresh.status(0) is EpochStatus.UNKNOWN
    assert fresh.claim_generation() == gen + 1


def test_a_zombie_whose_view_predates_a_compaction_is_still_fenced(tmp_path: Path) -> None:
    zombie = StoreProgressLog(str(tmp_path), "pipe")
    gen = zombie.claim_generation()
    for e in range(5):
        zombie.mark_many([(e, D), (e, C), (e, F)], gen)
    successor = StoreProgressLog(str(tmp_path), "pipe", keep_epochs=2)
    new_gen = successor.claim_generation()
    assert successor.compact(new_gen)
    successor.mark(5, D, new_gen)
    with pytest.raises(FencedError, match=f"generation {gen} rejected"):
        zombie.mark(6, D, gen)
    assert zombie.status(5) is D and zombie.status(0) is EpochStatus.UNKNOWN
    assert newest_status(tmp_path, 6) is None
