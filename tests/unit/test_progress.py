"""Unit tests of the progress log: transitions, fencing, durability of the file log."""

from __future__ import annotations

from pathlib import Path

import pytest

from expected_state.progress_log import StoreProgressLog
from reconcile.core.contract import FatalError, FencedError
from reconcile.core.progress import EpochStatus, MemoryProgressLog, ProgressLog
from reconcile.engine.progress_file import FileProgressLog

D, C, F, A = (
    EpochStatus.DECIDED,
    EpochStatus.COMMITTED,
    EpochStatus.FINALIZED,
    EpochStatus.ABORTED,
)


@pytest.fixture(params=["memory", "file", "store"])
def make_log(request: pytest.FixtureRequest, tmp_path: Path):  # type: ignore[no-untyped-def]
    if request.param == "memory":
        log = MemoryProgressLog()
        return lambda: log  # "reopening" a memory log returns the same object
    if request.param == "store":
        # The expected-state store's _epochs Delta table, reopened as a new object.
        from expected_state.progress_log import StoreProgressLog

        return lambda: StoreProgressLog(str(tmp_path), "pipe")
    return lambda: FileProgressLog(tmp_path, "pipe")


def test_transitions_and_idempotency(make_log) -> None:  # type: ignore[no-untyped-def]
    log: ProgressLog = make_log()
    gen = log.claim_generation()
    assert log.status(0) is None and log.last_committed() is None
    for status in (D, D, C, C, F, F):  # writing a status twice is a no-op
        log.mark(0, status, gen)
    assert log.status(0) is F and log.last_committed() == 0
    log.mark(1, D, gen)
    log.mark(1, A, gen)
    log.mark(1, D, gen)  # an aborted epoch may be decided again (retry)
    assert log.epochs_in(D) == [1]
    with pytest.raises(FatalError, match="epoch 0 cannot move from finalized to aborted"):
        log.mark(0, A, gen)
    with pytest.raises(FatalError, match="cannot move from unrecorded to committed"):
        log.mark(5, C, gen)


def test_a_committed_epoch_never_moves_to_aborted(make_log) -> None:  # type: ignore[no-untyped-def]
    # Past the commit point every sink must end up with the epoch: no writer,
    # this one or a newer generation after a restart, may take it back.
    log: ProgressLog = make_log()
    gen = log.claim_generation()
    log.mark(4, D, gen)
    log.mark(4, C, gen)
    with pytest.raises(FatalError, match="epoch 4 cannot move from committed to aborted"):
        log.mark(4, A, gen)
    restarted = make_log()
    later = restarted.claim_generation()
    with pytest.raises(FatalError, match="epoch 4 cannot move from committed to aborted"):
        restarted.mark(4, A, later)
    reopened = make_log()  # what the log holds durably (a new object reads the file or table)
    assert reopened.status(4) is C and reopened.epochs_in(A) == []
    assert reopened.last_committed() == 4
    reopened.mark(4, F, later)  # the one move committed allows
    assert make_log().status(4) is F


def test_state_survives_reopen(make_log) -> None:  # type: ignore[no-untyped-def]
    log = make_log()
    gen = log.claim_generation()
    log.mark(3, D, gen)
    log.mark(3, C, gen)
    reopened = make_log()
    assert reopened.status(3) is C
    assert reopened.last_committed() == 3
    assert reopened.claim_generation() == gen + 1


def test_newer_generation_fences_the_older(make_log) -> None:  # type: ignore[no-untyped-def]
    old = make_log()
    old_gen = old.claim_generation()
    new = make_log()
    new_gen = new.claim_generation()
    assert new_gen > old_gen
    with pytest.raises(FencedError, match=f"generation {old_gen} rejected"):
        old.mark(0, D, old_gen)
    new.mark(0, D, new_gen)


def test_torn_tail_is_dropped_on_open(tmp_path: Path) -> None:
    log = FileProgressLog(tmp_path, "pipe")
    gen = log.claim_generation()
    log.mark(0, D, gen)
    with open(log.path, "ab") as f:
        f.write(b'{"t": "epoch", "epoch": 0, "status": "comm')  # crash mid-write
    reopened = FileProgressLog(tmp_path, "pipe")
    assert reopened.status(0) is D  # the torn COMMITTED never counted
    reopened.mark(0, C, gen)
    assert FileProgressLog(tmp_path, "pipe").status(0) is C


@pytest.mark.parametrize("kind", ["file", "store"])
def test_truncate_keeps_what_recovery_needs(tmp_path: Path, kind: str) -> None:
    log = _durable_log(kind, tmp_path)
    gen = log.claim_generation()
    for e in range(3):
        for s in (D, C, F):
            log.mark(e, s, gen)
    log.mark(3, D, gen)
    with pytest.raises(FatalError, match=r"epochs \[3\] are not finalized"):
        log.truncate(4, gen)
    log.truncate(2, gen)
    assert log.status(1) is EpochStatus.UNKNOWN
    assert log.status(2) is F
    assert _durable_log(kind, tmp_path).status(0) is EpochStatus.UNKNOWN


@pytest.mark.parametrize("kind", ["file", "store"])
def test_a_zombie_cannot_truncate(tmp_path: Path, kind: str) -> None:
    old = _durable_log(kind, tmp_path)
    gen = old.claim_generation()
    for s in (D, C, F):
        old.mark(0, s, gen)
    _durable_log(kind, tmp_path).claim_generation()
    with pytest.raises(FencedError):
        old.truncate(1, gen)
    assert _durable_log(kind, tmp_path).status(0) is F  # nothing was truncated


def _durable_log(kind: str, root: Path) -> FileProgressLog | StoreProgressLog:
    """A new object over the same durable log: the file log, or the store's epochs table."""
    if kind == "store":
        return StoreProgressLog(str(root), "pipe")
    return FileProgressLog(root, "pipe")


def test_takeover_inside_the_fence_window_is_caught_under_the_lock(tmp_path: Path) -> None:
    # The zombie checks its generation, then a newer writer claims one, then the
    # zombie appends: the re-check under the flock must refuse the write.
    from reconcile.core import hooks
    from reconcile.core.progress import MARK_CHECKED

    zombie = FileProgressLog(tmp_path, "pipe")
    gen = zombie.claim_generation()
    successor = FileProgressLog(tmp_path, "pipe")
    with (
        hooks.at(MARK_CHECKED, successor.claim_generation) as window,
        pytest.raises(FencedError, match=f"generation {gen} rejected"),
    ):
        zombie.mark(0, D, gen)
    assert window.fired == 1
    # Nothing of the zombie's reached the file: a fresh reader sees no epoch 0.
    assert FileProgressLog(tmp_path, "pipe").status(0) is None


def test_log_identity_is_fixed_at_creation(tmp_path: Path) -> None:
    from reconcile.engine.progress_file import read_progress

    first = FileProgressLog(tmp_path, "pipe")
    assert FileProgressLog(tmp_path, "pipe").log_id == first.log_id
    assert read_progress(tmp_path, "pipe").log_id == first.log_id
    assert FileProgressLog(tmp_path / "other", "pipe").log_id != first.log_id
    assert MemoryProgressLog().log_id != MemoryProgressLog().log_id


def test_read_progress_writes_nothing(tmp_path: Path) -> None:
    from reconcile.core.contract import ConfigurationError
    from reconcile.engine.progress_file import read_progress

    with pytest.raises(ConfigurationError, match="no progress log for pipeline 'pipe'"):
        read_progress(tmp_path, "pipe")
    assert list(tmp_path.iterdir()) == []
    log = FileProgressLog(tmp_path, "pipe")
    log.mark(0, D, log.claim_generation())
    with open(log.path, "ab") as f:
        f.write(b'{"t": "epo')  # a torn tail: read-only readers leave it alone
    size = log.path.stat().st_size
    assert read_progress(tmp_path, "pipe").statuses == {0: D}
    assert log.path.stat().st_size == size


def _finalize(log: FileProgressLog, epochs: range, gen: int) -> None:
    for e in epochs:
        for s in (D, C, F):
            log.mark(e, s, gen)


def test_the_log_compacts_itself_and_keeps_what_recovery_needs(tmp_path: Path) -> None:
    log = FileProgressLog(tmp_path, "pipe", compact_after_lines=60, keep_epochs=5)
    gen = log.claim_generation()
    _finalize(log, range(0, 30), gen)
    log.mark(30, D, gen)  # not finalized: must survive every compaction
    _finalize(log, range(31, 40), gen)
    lines = log.path.read_text().splitlines()
    assert len(lines) < 60, len(lines)  # it did compact: 40 epochs are ~120 lines
    fresh = FileProgressLog(tmp_path, "pipe")
    assert fresh.log_id == log.log_id
    assert fresh.last_committed() == 39
    assert fresh.status(30) is D
    assert [fresh.status(e) for e in range(35, 40)] == [F] * 5
    assert fresh.status(0) is EpochStatus.UNKNOWN
    assert fresh.claim_generation() == gen + 1  # the generation survived


def test_a_zombie_whose_view_predates_a_compaction_is_still_fenced(tmp_path: Path) -> None:
    zombie = FileProgressLog(tmp_path, "pipe")
    gen = zombie.claim_generation()
    _finalize(zombie, range(0, 10), gen)  # the zombie has read the whole old file
    successor = FileProgressLog(tmp_path, "pipe", keep_epochs=2)
    new_gen = successor.claim_generation()
    successor.compact(new_gen)  # a new, shorter file
    successor.mark(10, D, new_gen)
    with pytest.raises(FencedError, match=f"generation {gen} rejected"):
        zombie.mark(11, D, gen)
    assert zombie.status(10) is D  # it reads the new file, not a stale tail of the old
    assert FileProgressLog(tmp_path, "pipe").status(11) is None


def test_compaction_keeps_which_generation_passed_each_commit_point(tmp_path: Path) -> None:
    from sinks.postgres.admin import committed_attempts

    log = FileProgressLog(tmp_path, "pipe", keep_epochs=10)
    first = log.claim_generation()
    _finalize(log, range(0, 3), first)
    second = log.claim_generation()
    _finalize(log, range(3, 5), second)
    log.mark(5, D, second)
    log.mark(5, C, second)
    before = committed_attempts(tmp_path, "pipe")
    log.compact(second)
    assert (
        committed_attempts(tmp_path, "pipe")
        == before
        == {(0, first), (1, first), (2, first), (3, second), (4, second), (5, second)}
    )
    assert FileProgressLog(tmp_path, "pipe").status(5) is C
