"""Unit tests of the commit cycle over memory sinks: order, outcomes, metrics, bad input."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pytest

from reconcile.core.contract import (
    OK,
    ConfigurationError,
    ContractViolationError,
    EpochOrderError,
    Fatal,
    FatalError,
    InvalidInputError,
    OutcomeUnknownError,
    Retryable,
    SinkOutcome,
    SinkTxnId,
    UnknownSinkError,
)
from reconcile.core.metrics import InMemoryMetrics
from reconcile.core.progress import EpochStatus, MemoryProgressLog
from reconcile.core.sink import SinkCapabilities
from reconcile.engine.cycle import CommitAborted, CommitCycle, CommitSucceeded
from reconcile.engine.faults import Fault, FaultKind, FaultPlan
from reconcile.testing.harness import rows_for
from sinks.memory.sink import MemorySink, MemoryStore


class RecordingSink(MemorySink):
    """A memory sink that records the order of the calls it receives."""

    def __init__(self, name: str, store: MemoryStore, calls: list[str]) -> None:
        super().__init__(name, store)
        self.calls = calls

    def stage(self, txn_id: SinkTxnId, rows: Iterable[Any]) -> SinkOutcome:
        self.calls.append(f"{self.name}.stage")
        return super().stage(txn_id, rows)

    def prepare(self, txn_id: SinkTxnId) -> SinkOutcome:
        self.calls.append(f"{self.name}.prepare")
        return super().prepare(txn_id)

    def commit(self, txn_id: SinkTxnId) -> SinkOutcome:
        self.calls.append(f"{self.name}.commit")
        return super().commit(txn_id)


class BrokenSink(MemorySink):
    """Returns ``None`` from prepare: a contract violation."""

    def prepare(self, txn_id: SinkTxnId) -> SinkOutcome:
        super().prepare(txn_id)
        return None  # type: ignore[return-value]


def _cycle(*names: str, store: MemoryStore | None = None, **kw: Any) -> CommitCycle:
    store = store or MemoryStore()
    return CommitCycle("pipe", [MemorySink(n, store) for n in names], MemoryProgressLog(), **kw)


def test_steps_run_in_order_and_epochs_commit() -> None:
    calls: list[str] = []
    store = MemoryStore()
    progress = MemoryProgressLog()
    metrics = InMemoryMetrics()
    sinks = [RecordingSink(n, store, calls) for n in ("a", "b")]
    cycle = CommitCycle("pipe", sinks, progress, metrics=metrics)
    assert cycle.start().generation == 1
    for epoch in range(3):
        assert cycle.run_epoch(epoch, {"a": rows_for(epoch)}) == CommitSucceeded(epoch)
    assert calls[:6] == ["a.stage", "b.stage", "a.prepare", "b.prepare", "a.commit", "b.commit"]
    assert {e: rows for (_, s, e), (_, rows) in store.committed.items() if s == "a"} == {
        e: rows_for(e) for e in range(3)
    }
    # b was declared but got no rows: it still commits each epoch, empty.
    assert [rows for (_, s, _), (_, rows) in store.committed.items() if s == "b"] == [[], [], []]
    assert progress.epochs_in(EpochStatus.FINALIZED) == [0, 1, 2]
    assert metrics.counters["cycle.outcome.CommitSucceeded"] == 3
    assert len(metrics.timings["cycle.step.prepare"]) == 3
    assert set(metrics.summary()["timings"]) >= {  # type: ignore[call-overload]
        f"cycle.step.{s}" for s in ("begin", "stage", "record_progress", "commit", "finalize")
    }


def test_replay_of_committed_epoch_is_a_no_op() -> None:
    store = MemoryStore()
    cycle = _cycle("a", store=store)
    cycle.start()
    cycle.run_epoch(0, {"a": rows_for(0)})
    again = cycle.run_epoch(0, {"a": rows_for(0)})
    assert again == CommitSucceeded(0, replayed=True)
    assert len(store.committed) == 1


def test_aborted_epoch_leaves_nothing_and_retries() -> None:
    store = MemoryStore()
    plan = FaultPlan([Fault("sink.b.prepare", FaultKind.RETRYABLE)])
    from reconcile.engine.faults import FaultySink

    cycle = CommitCycle(
        "pipe",
        [FaultySink(MemorySink(n, store), plan) for n in ("a", "b")],
        MemoryProgressLog(),
        faults=plan,
    )
    cycle.start()
    result = cycle.run_epoch(0, {"a": rows_for(0), "b": rows_for(0)})
    assert isinstance(result, CommitAborted) and result.step == "prepare"
    assert "sink 'b'" in result.reason
    assert store.committed == {} and store.prepared == {}
    assert cycle.run_epoch(0, {"a": rows_for(0), "b": rows_for(0)}) == CommitSucceeded(0)


# ------------------------------------------------------------------ bad input


def test_sink_returning_a_non_outcome_is_a_clear_error_with_nothing_committed() -> None:
    store = MemoryStore()
    progress = MemoryProgressLog()
    cycle = CommitCycle("pipe", [MemorySink("a", store), BrokenSink("b", store)], progress)
    cycle.start()
    with pytest.raises(ContractViolationError, match=r"sink 'b' returned None .* from prepare"):
        cycle.run_epoch(0, {"a": rows_for(0), "b": rows_for(0)})
    assert store.committed == {} and store.prepared == {}
    assert progress.status(0) is EpochStatus.ABORTED


def test_recover_returning_non_txn_ids_is_a_contract_violation() -> None:
    class BadRecover(MemorySink):
        def recover(self) -> Sequence[SinkTxnId]:
            return ["pipe-a-0-g1"]  # type: ignore[list-item]

    cycle = CommitCycle("pipe", [BadRecover("a", MemoryStore())], MemoryProgressLog())
    with pytest.raises(ContractViolationError, match="must return SinkTxnId"):
        cycle.start()


def test_rows_for_an_undeclared_sink_are_rejected_before_staging() -> None:
    store = MemoryStore()
    cycle = _cycle("a", store=store)
    cycle.start()
    with pytest.raises(
        UnknownSinkError, match=r"undeclared sink\(s\) \['zz'\].*Nothing was staged"
    ):
        cycle.run_epoch(0, {"a": rows_for(0), "zz": rows_for(0)})
    assert store.committed == {} and store.prepared == {}


def test_epoch_going_backwards_is_rejected() -> None:
    store = MemoryStore()
    cycle = _cycle("a", store=store)
    cycle.start()
    cycle.run_epoch(5, {"a": rows_for(5)})
    with pytest.raises(
        EpochOrderError, match="epoch 4 goes backwards; epoch 5 is already committed"
    ):
        cycle.run_epoch(4, {"a": rows_for(4)})
    for bad in (-1, "6", True):
        with pytest.raises(EpochOrderError):
            cycle.run_epoch(bad, {})  # type: ignore[arg-type]
    assert len(store.committed) == 1


@pytest.mark.parametrize(
    ("names", "message"),
    [
        ((), "declares no sinks"),
        (("a", "a"), "declares sink 'a' twice"),
        (("",), "sink name must be a non-empty string"),
        (("a-b",), "sink name 'a-b' is invalid"),
    ],
)
def test_sink_declarations_are_checked(names: tuple[str, ...], message: str) -> None:
    class Named:
        def __init__(self, name: str) -> None:
            self.name = name

        def stage(self, txn_id: SinkTxnId, rows: Iterable[Any]) -> SinkOutcome:
            return OK

        prepare = commit = abort = lambda self, txn_id: OK
        recover = lambda self: []  # noqa: E731

    with pytest.raises(ConfigurationError, match=message):
        CommitCycle("pipe", [Named(n) for n in names], MemoryProgressLog())  # type: ignore[misc]


def test_not_a_sink_is_rejected() -> None:
    with pytest.raises(
        ConfigurationError,
        match="is not a TwoPhaseSink: it lacks name, stage, prepare, commit, abort, recover",
    ):
        CommitCycle("pipe", [object()], MemoryProgressLog())  # type: ignore[list-item]


def test_run_before_start_is_an_error() -> None:
    with pytest.raises(InvalidInputError, match="call start"):
        _cycle("a").run_epoch(0, {})


def test_start_never_finalizes_an_epoch_a_sink_does_not_hold() -> None:
    # The log says epoch 0 passed the commit point, but the sink lost its
    # prepared batch (and so does not list it): finalizing would hide a hole.
    store = MemoryStore()
    progress = MemoryProgressLog()
    gen = progress.claim_generation()
    progress.mark(0, EpochStatus.DECIDED, gen)
    progress.mark(0, EpochStatus.COMMITTED, gen)
    cycle = CommitCycle("pipe", [MemorySink("a", store)], progress)
    with pytest.raises(
        FatalError, match=r"could not commit committed epoch pipe-a-0-g2 in sink 'a'"
    ):
        cycle.start()
    assert progress.status(0) is EpochStatus.COMMITTED


class VolatileSink(MemorySink):
    """Like Postgres in transactional mode: the prepared batch lives in the client only."""

    capabilities = SinkCapabilities(durable_prepare=False)

    def __init__(self, name: str, store: MemoryStore) -> None:
        super().__init__(name, store)
        self._open: dict[SinkTxnId, list[Any]] = {}

    def prepare(self, txn_id: SinkTxnId) -> SinkOutcome:
        if txn_id not in self._staged:
            return Retryable("nothing staged")
        self._open[txn_id] = self._staged.pop(txn_id)
        return OK

    def commit(self, txn_id: SinkTxnId) -> SinkOutcome:
        if txn_id.key in self.store.committed:
            return OK  # the "marker": this epoch is in
        if txn_id not in self._open:
            return Fatal(f"{txn_id}: the open txn died; replay the epoch")
        self.store.committed[txn_id.key] = (txn_id, self._open.pop(txn_id))
        return OK

    def recover(self) -> Sequence[SinkTxnId]:
        return []


def test_a_sink_without_durable_prepare_gets_the_epoch_replayed_after_a_crash() -> None:
    store = MemoryStore()
    progress = MemoryProgressLog()
    plan = FaultPlan([Fault("cycle.commit_progress", FaultKind.CRASH, when="after")])
    from reconcile.engine.faults import FaultySink, SimulatedCrash

    doomed = CommitCycle(
        "pipe", [FaultySink(VolatileSink("v", store), plan)], progress, faults=plan
    )
    doomed.start()
    with pytest.raises(SimulatedCrash):
        doomed.run_epoch(0, {"v": rows_for(0)})
    assert progress.status(0) is EpochStatus.COMMITTED and store.committed == {}
    metrics = InMemoryMetrics()
    cycle = CommitCycle("pipe", [VolatileSink("v", store)], progress, metrics=metrics)
    report = cycle.start()
    assert report.replay_needed == {0: ["v"]}
    assert progress.status(0) is EpochStatus.COMMITTED  # not finalized over a hole
    # Another epoch first: refused, since epoch 0's outputs are not at hand.
    result = cycle.run_epoch(1, {"v": rows_for(1)})
    assert result.__class__.__name__ == "CommitFatal"
    assert "run_epoch(0, outputs) to replay it" in result.reason  # type: ignore[union-attr]
    assert cycle.run_epoch(0, {"v": iter(rows_for(0))}) == CommitSucceeded(0)
    assert metrics.counters["sink.commit.replayed"] == 1
    assert cycle.run_epoch(1, {"v": rows_for(1)}) == CommitSucceeded(1)
    assert {k: rows for k, (_, rows) in store.committed.items()} == {
        ("pipe", "v", 0): rows_for(0),
        ("pipe", "v", 1): rows_for(1),
    }


def test_a_sink_that_cannot_tell_is_not_retried_into_a_guess() -> None:
    class Unsure(VolatileSink):
        def commit(self, txn_id: SinkTxnId) -> SinkOutcome:
            raise OutcomeUnknownError(f"{txn_id}: xid committed but no marker")

    store = MemoryStore()
    metrics = InMemoryMetrics()
    cycle = CommitCycle("pipe", [Unsure("u", store)], MemoryProgressLog(), metrics=metrics)
    cycle.start()
    result = cycle.run_epoch(0, {"u": rows_for(0)})
    assert result.__class__.__name__ == "CommitFatal"
    assert "OutcomeUnknownError: pipe-u-0-g1: xid committed but no marker" in result.reason  # type: ignore[union-attr]
    assert metrics.counters["sink.commit.replayed"] == 0 and store.committed == {}


def test_a_progress_log_of_the_wrong_kind_is_refused_at_construction(tmp_path: Path) -> None:
    # A new user passed the store's EpochLog, which failed much later with an AttributeError.
    from expected_state.epochs import EpochLog

    with pytest.raises(ConfigurationError, match="EpochLog is not a progress log: it lacks"):
        CommitCycle(
            "pipe", [MemorySink("out", MemoryStore())], EpochLog(str(tmp_path), "pipe", "out")
        )
