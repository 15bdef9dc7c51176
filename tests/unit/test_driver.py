"""Unit tests of the driver: backoff, what stops at once, what restarts, and resume."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import pytest

from reconcile.contract import (
    ConfigurationError,
    Fatal,
    FatalError,
    FencedError,
    RetryableError,
    SinkOutcome,
    SinkTxnId,
    WriterIdentity,
)
from reconcile.cycle import CommitCycle
from reconcile.decisions import Settle, decide_stranded, is_terminal
from reconcile.driver import RetryPolicy, drive
from reconcile.progress import EpochStatus, MemoryProgressLog
from reconcile.results import CommitFatal
from reconcile.sink import SinkCapabilities
from sinks.memory import MemorySink, MemoryStore

FAST = RetryPolicy(give_up_after_s=5.0, initial_s=0.0, max_s=0.0, jitter_s=0.0)


class Flaky(MemorySink):
    """A memory sink whose bind or prepare fails on the first ``n`` calls."""

    def __init__(
        self, store: MemoryStore, *, bind_errors: Sequence[Exception] = (), prepare: Any = None
    ) -> None:
        super().__init__("out", store)
        self.bind_errors = list(bind_errors)
        # Scripted prepare outcomes, in order; None runs the real prepare.
        self.prepare_outcomes: list[SinkOutcome | None] = list(prepare or [])
        self.binds = 0

    def bind(self, writer: WriterIdentity) -> None:
        self.binds += 1
        if self.bind_errors:
            raise self.bind_errors.pop(0)

    def prepare(self, txn_id: SinkTxnId) -> SinkOutcome:
        scripted = self.prepare_outcomes.pop(0) if self.prepare_outcomes else None
        return super().prepare(txn_id) if scripted is None else scripted


def outputs(epoch: int) -> dict[str, Iterable[Any]]:
    return {"out": [{"k": epoch}]}


def committed(store: MemoryStore) -> list[int]:
    return sorted(txn.epoch for txn, _ in store.committed.values())


def test_a_terminal_error_at_start_stops_at_once_without_claiming_a_generation() -> None:
    log, store, builds = MemoryProgressLog(), MemoryStore(), []

    def build() -> CommitCycle:
        sink = Flaky(store, bind_errors=[ConfigurationError("password authentication failed")])
        builds.append(sink)
        return CommitCycle("pipe", [sink], log)

    with pytest.raises(ConfigurationError, match="password authentication failed"):
        drive(build, range(3), outputs, retry=FAST)
    assert len(builds) == 1
    assert log.claim_generation() == 1  # none was claimed before this one


def test_an_unreachable_sink_at_start_is_retried_on_the_same_generation() -> None:
    log, store = MemoryProgressLog(), MemoryStore()
    sink = Flaky(store, bind_errors=[RetryableError("connection refused")] * 4)
    report = drive(lambda: CommitCycle("pipe", [sink], log), range(3), outputs, retry=FAST)
    assert report.committed_epochs == [0, 1, 2]
    assert sink.binds == 5 and report.restarts == 0
    assert log.claim_generation() == 2  # one generation for the whole run


def test_backoff_grows_between_attempts(monkeypatch: pytest.MonkeyPatch) -> None:
    # Count the waits the driver asks for, not the wall clock.
    import time

    waits: list[float] = []
    monkeypatch.setattr(time, "sleep", waits.append)
    log, store = MemoryProgressLog(), MemoryStore()
    sink = Flaky(store, bind_errors=[RetryableError("connection refused")] * 6)
    policy = RetryPolicy(give_up_after_s=60, initial_s=0.1, max_s=1.0, jitter_s=0.0)
    drive(lambda: CommitCycle("pipe", [sink], log), range(1), outputs, retry=policy)
    assert waits == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]


def test_an_epoch_that_keeps_failing_gives_up_with_its_first_and_last_error() -> None:
    log, store = MemoryProgressLog(), MemoryStore()
    from reconcile.contract import Retryable

    reasons = [Retryable("first: lock not available")] + [Retryable("later: timeout")] * 10_000
    sink = Flaky(store, prepare=reasons)
    policy = RetryPolicy(give_up_after_s=0.3, initial_s=0.0, max_s=0.0, jitter_s=0.0)
    with pytest.raises(FatalError, match=r"first error: .*first: lock not available.*later"):
        drive(lambda: CommitCycle("pipe", [sink], log), range(1), outputs, retry=policy)
    assert committed(store) == []


def test_a_fatal_outcome_before_the_commit_point_stops_with_its_typed_cause() -> None:
    log, store = MemoryProgressLog(), MemoryStore()
    fenced = FencedError("generation 9 has taken over")
    sink = Flaky(store, prepare=[Fatal.of(fenced)])
    builds = []

    def build() -> CommitCycle:
        builds.append(1)
        return CommitCycle("pipe", [sink], log)

    with pytest.raises(FencedError, match="generation 9 has taken over"):
        drive(build, range(3), outputs, retry=FAST)
    assert len(builds) == 1 and committed(store) == []
    sink.prepare_outcomes = [Fatal("row 3 is not JSON")]
    with pytest.raises(FatalError, match="row 3 is not JSON"):
        drive(build, range(3), outputs, retry=FAST)


def test_running_the_same_drive_again_resumes() -> None:
    log, store = MemoryProgressLog(), MemoryStore()
    sink = Flaky(store, prepare=[None, None, None, Fatal("disk full")])

    def build() -> CommitCycle:
        return CommitCycle("pipe", [sink], log)

    with pytest.raises(FatalError, match="disk full"):
        drive(build, range(6), outputs, retry=FAST)
    assert committed(store) == [0, 1, 2]
    report = drive(build, range(6), outputs, retry=FAST)  # the same call, again
    assert report.skipped_epochs == [0, 1]
    assert report.committed_epochs == [2, 3, 4, 5]  # 2 replayed (already in), 3.. run
    assert committed(store) == [0, 1, 2, 3, 4, 5]


class Forgetful(MemorySink):
    """A sink without a durable prepare: its prepared txn dies with the client."""

    capabilities = SinkCapabilities(durable_prepare=False)

    def commit(self, txn_id: SinkTxnId) -> SinkOutcome:
        if txn_id.key not in self.store.committed and txn_id.key not in self.store.prepared:
            return Fatal(f"{txn_id}: the open txn died; replay the epoch")
        return super().commit(txn_id)


def test_the_driver_replays_an_epoch_in_doubt_into_a_sink_that_lost_it() -> None:
    log, store = MemoryProgressLog(), MemoryStore()
    first = CommitCycle("pipe", [Forgetful("out", store)], log)
    first.start()
    # Epoch 0 passes the commit point, then the process dies before the sink
    # commit: the open txn of a non-durable sink dies with it.
    first.progress.mark(0, EpochStatus.DECIDED, first.generation or 0)
    first.progress.mark(0, EpochStatus.COMMITTED, first.generation or 0)

    def build() -> CommitCycle:
        return CommitCycle("pipe", [Forgetful("out", store)], log)

    report = drive(build, range(0, 3), outputs, retry=FAST)
    assert committed(store) == [0, 1, 2]
    assert report.committed_epochs == [0, 1, 2]


def test_decide_stranded_is_the_failure_matrix() -> None:
    assert decide_stranded(EpochStatus.COMMITTED) is Settle.COMMIT
    assert decide_stranded(EpochStatus.FINALIZED) is Settle.COMMIT
    assert decide_stranded(EpochStatus.DECIDED) is Settle.ABORT
    assert decide_stranded(EpochStatus.ABORTED) is Settle.ABORT
    assert decide_stranded(None) is Settle.ABORT
    assert decide_stranded(EpochStatus.UNKNOWN) is Settle.REPORT


def test_terminal_errors() -> None:
    assert is_terminal(FencedError("x")) and is_terminal(ConfigurationError("x"))
    assert not is_terminal(RetryableError("x")) and not is_terminal(FatalError("x"))
    assert not is_terminal(None)


def test_commit_fatal_compares_by_what_it_says() -> None:
    a = CommitFatal(1, "commit", "x", FatalError("x"), restart=True)
    assert a == CommitFatal(1, "commit", "x")


def test_a_start_that_cannot_settle_stops_instead_of_claiming_generations() -> None:
    log, store = MemoryProgressLog(), MemoryStore()
    sink = MemorySink("out", store)
    cycle = CommitCycle("pipe", [sink], log)
    cycle.start()
    # The log says epoch 0 committed; the (durable) sink has neither committed
    # nor prepared it: a hole that no restart can fill.
    log.mark(0, EpochStatus.DECIDED, cycle.generation or 0)
    log.mark(0, EpochStatus.COMMITTED, cycle.generation or 0)
    with pytest.raises(FatalError, match="could not commit committed epoch pipe-out-0"):
        drive(lambda: CommitCycle("pipe", [MemorySink("out", store)], log), range(2), outputs,
              retry=FAST)  # fmt: skip
    assert log.claim_generation() == 3  # the drive claimed one generation, not thousands
