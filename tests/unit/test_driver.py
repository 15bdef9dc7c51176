"""Unit tests of the driver: backoff, what stops at once, what restarts, and resume."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import pytest

from reconcile.core.contract import (
    ConfigurationError,
    DeterministicError,
    Fatal,
    FatalError,
    FencedError,
    OutcomeUnknownError,
    RejectedError,
    Retryable,
    RetryableError,
    SinkOutcome,
    SinkTxnId,
    WriterIdentity,
)
from reconcile.core.decisions import Settle, decide_stranded, deterministic_error, is_terminal
from reconcile.core.metrics import InMemoryMetrics
from reconcile.core.progress import EpochStatus, MemoryProgressLog
from reconcile.core.results import CommitFatal
from reconcile.core.sink import SinkCapabilities
from reconcile.engine.cycle import CommitCycle
from reconcile.engine.driver import Driver, RetryPolicy, drive
from reconcile.engine.faults import Fault, FaultKind, FaultPlan
from sinks.memory.sink import MemorySink, MemoryStore

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


def _rejected(epoch: int) -> RejectedError:
    return RejectedError.of(epoch=epoch, table="shop.lines", sqlstate="23514", sink="out",
                            reason='violates check constraint "qty_positive"',
                            constraint="qty_positive")  # fmt: skip


def test_a_rejected_epoch_stops_at_once_counted_and_named() -> None:
    log, store, metrics = MemoryProgressLog(), MemoryStore(), InMemoryMetrics()
    # Epoch 0 goes in; every prepare of epoch 1 is refused by the "database".
    sink = Flaky(store, prepare=[None] + [Fatal("check violation", _rejected(1))] * 50)

    def build() -> CommitCycle:
        return CommitCycle("pipe", [sink], log, metrics=metrics)

    with pytest.raises(RejectedError) as stopped:
        drive(build, range(3), outputs, retry=FAST)
    assert stopped.value.epoch == 1 and stopped.value.table == "shop.lines"
    assert "epoch 1" in str(stopped.value) and "constraint qty_positive" in str(stopped.value)
    assert len(sink.prepare_outcomes) == 49  # epoch 1 was prepared once: no retry
    assert committed(store) == [0]
    assert log.claim_generation() == 2  # no restart claimed a generation
    labels = {"pipeline": "pipe", "sink": "out", "sqlstate": "23514"}
    assert metrics.value("pipeline.rejected", **labels) == 1


def test_a_rejection_behind_an_aborted_result_still_stops() -> None:
    # However a result carries it (here an outcome the sink called Retryable),
    # a rejection is never run again: the one classification decides.
    log, store = MemoryProgressLog(), MemoryStore()
    sink = Flaky(store, prepare=[Retryable("refused", _rejected(0))] * 50)
    with pytest.raises(RejectedError):
        drive(lambda: CommitCycle("pipe", [sink], log), range(1), outputs, retry=FAST)
    assert len(sink.prepare_outcomes) == 49


def test_a_stopped_driver_hands_its_cycle_on_unless_it_is_in_doubt() -> None:
    log, store = MemoryProgressLog(), MemoryStore()
    sink = Flaky(store, prepare=[Fatal("refused", _rejected(0))])
    driver = Driver(lambda: CommitCycle("pipe", [sink], log), retry=FAST)
    with pytest.raises(RejectedError):
        driver.run(0, outputs)
    handed = driver.detach()
    assert handed is not None and handed[0].generation == 1 and handed[1] == []
    assert driver.cycle is None and driver.detach() is None
    # The handed-on cycle runs the epoch again as the same generation.
    again = Driver(lambda: CommitCycle("pipe", [sink], log), retry=FAST)
    again.adopt(*handed)
    again.run(0, outputs)
    assert committed(store) == [0] and log.claim_generation() == 2
    # An outcome nobody can settle leaves the cycle in doubt: nothing is handed on.
    doubtful = Flaky(store)
    doubtful.commit = lambda txn: (_ for _ in ()).throw(OutcomeUnknownError("no reply"))  # type: ignore[method-assign]
    driver = Driver(lambda: CommitCycle("pipe", [doubtful], log), retry=FAST)
    with pytest.raises(OutcomeUnknownError):
        driver.run(1, outputs)
    assert driver.detach() is None


def test_a_give_up_after_restarts_hands_nothing_on() -> None:
    log, store = MemoryProgressLog(), MemoryStore()
    faults = FaultPlan([Fault("cycle.begin", FaultKind.FATAL, nth=1, times=10_000)])
    policy = RetryPolicy(give_up_after_s=0.2, initial_s=0.0, max_s=0.0, jitter_s=0.0)
    driver = Driver(lambda: CommitCycle("pipe", [MemorySink("out", store)], log, faults=faults),
                    retry=policy)  # fmt: skip
    with pytest.raises(FatalError, match="did not commit within"):
        driver.run(0, outputs)
    assert driver.detach() is None  # something was in doubt: only a new start() goes on


class Raising(Flaky):
    """A Flaky sink whose prepare raises the given exceptions, one per call, then prepares."""

    def __init__(self, store: MemoryStore, errors: Sequence[Exception]) -> None:
        super().__init__(store)
        self.errors = list(errors)
        self.prepares = 0

    def prepare(self, txn_id: SinkTxnId) -> SinkOutcome:
        self.prepares += 1
        if self.errors:
            raise self.errors.pop(0)
        return super().prepare(txn_id)


@pytest.mark.parametrize(
    "error",
    [
        NotImplementedError("can't parse timestamptz with DateStyle 'SQL, DMY'"),
        TypeError("unhashable type: 'dict'"),
        ValueError("Duplicate field name (case-insensitive): 'Note'"),
        KeyError("label"),
    ],
)
def test_an_error_that_is_the_same_every_time_stops_at_once_at_start(error: Exception) -> None:
    log, store, builds = MemoryProgressLog(), MemoryStore(), []

    def build() -> CommitCycle:
        sink = Flaky(store, bind_errors=[error] * 100)
        builds.append(sink)
        return CommitCycle("pipe", [sink], log)

    with pytest.raises(DeterministicError, match=type(error).__name__) as raised:
        drive(build, range(3), outputs, retry=FAST)
    assert "bind() of sink 'out'" in str(raised.value)
    assert raised.value.details["cause"] == type(error).__name__
    assert len(builds) == 1 and builds[0].binds == 1  # not retried, not restarted
    assert log.claim_generation() == 1


def test_an_error_that_is_the_same_every_time_stops_an_epoch_at_once() -> None:
    log, store = MemoryProgressLog(), MemoryStore()
    sink = Raising(store, [TypeError("cannot convert a dict")] * 100)
    with pytest.raises(DeterministicError, match=r"prepare\(pipe-out-0-g1\).*TypeError"):
        drive(lambda: CommitCycle("pipe", [sink], log), range(2), outputs, retry=FAST)
    assert sink.prepares == 1 and committed(store) == []


def test_an_error_a_retry_may_cure_is_still_retried() -> None:
    log, store = MemoryProgressLog(), MemoryStore()
    sink = Raising(store, [ConnectionResetError("peer reset"), RuntimeError("busy")])
    report = drive(lambda: CommitCycle("pipe", [sink], log), range(2), outputs, retry=FAST)
    assert report.committed_epochs == [0, 1] and report.retries == 2
    assert sink.bind_errors == []


def test_deterministic_errors_are_terminal_and_service_failures_are_not() -> None:
    for error in (ValueError("x"), TypeError("x"), LookupError("x"), NotImplementedError("x")):
        found = deterministic_error(error, "step")
        assert found is not None and is_terminal(found)
    for error in (OSError("x"), TimeoutError("x"), ConnectionError("x"), RuntimeError("x")):
        assert deterministic_error(error, "step") is None
    assert deterministic_error(RetryableError("x"), "step") is None
