"""Metrics with labels and gauges, the active metrics of a running cycle, what a cycle reports."""

from __future__ import annotations

import contextvars
import threading

import pytest

from reconcile import CommitCycle, CommitFatal, CommitSucceeded, MemoryProgressLog
from reconcile.core.contract import Fatal, SinkOutcome, SinkTxnId
from reconcile.core.metrics import (
    InMemoryMetrics,
    NullMetrics,
    activate,
    active,
    record_drift,
    record_report,
    timed,
    with_labels,
)
from reconcile.engine.faults import Fault, FaultKind, FaultPlan
from reconcile.recovery.report import ReconcileReport
from sinks.memory.sink import MemorySink, MemoryStore


def test_counters_keep_their_old_keys_and_gain_labels() -> None:
    m = InMemoryMetrics()
    m.count("sink.commit.retryable")  # the first form: no labels
    m.count("sink.commit.retryable", 2, pipeline="p", sink="a")
    m.count("sink.commit.retryable", sink="b", pipeline="p")
    assert m.counters["sink.commit.retryable"] == 4
    assert m.value("sink.commit.retryable", sink="a") == 2
    assert m.value("sink.commit.retryable", pipeline="p") == 3
    assert m.value("sink.commit.retryable", pipeline="q") == 0
    with timed(m, "cycle.step.stage", pipeline="p"):
        pass
    assert len(m.timings["cycle.step.stage"]) == 1 and m.durations("cycle.step.stage", pipeline="p")
    m.set("cycle.last_committed_epoch", 7, pipeline="p")
    m.set("cycle.last_committed_epoch", 9, pipeline="p")
    assert m.gauge("cycle.last_committed_epoch", pipeline="p") == 9
    assert m.gauge("cycle.last_committed_epoch", pipeline="q") is None
    assert m.summary()["gauges"] == {"cycle.last_committed_epoch{pipeline=p}": 9}


def test_fixed_labels_are_added_and_a_call_wins() -> None:
    m = InMemoryMetrics()
    bound = with_labels(with_labels(m, pipeline="p", sink="x"), sink="y")
    bound.count("a")
    bound.count("a", sink="z")
    bound.observe("t", 0.5)
    bound.set("g", 1.0)
    assert m.value("a", pipeline="p", sink="y") == 1 and m.value("a", sink="z") == 1
    assert m.durations("t", pipeline="p", sink="y") == [0.5]
    assert m.gauge("g", pipeline="p", sink="y") == 1.0


class FirstFormMetrics:
    """A Metrics written before labels and gauges existed."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, float]] = []

    def count(self, name: str, value: int = 1) -> None:
        self.seen.append((name, value))

    def observe(self, name: str, seconds: float) -> None:
        self.seen.append((name, seconds))


def test_a_metrics_of_the_first_form_still_works_in_a_cycle() -> None:
    legacy = FirstFormMetrics()
    cycle = CommitCycle(
        "pipe", [MemorySink("a", MemoryStore())], MemoryProgressLog(), metrics=legacy
    )  # type: ignore[arg-type]
    cycle.start()
    assert cycle.run_epoch(0, {"a": [{"k": 1}]}) == CommitSucceeded(0)
    assert ("cycle.outcome.CommitSucceeded", 1) in legacy.seen


def test_active_is_null_outside_and_the_cycles_metrics_inside() -> None:
    assert isinstance(active(), NullMetrics)
    seen: list[object] = []

    class Spy(MemorySink):
        def commit(self, txn_id: SinkTxnId) -> SinkOutcome:
            active().count("spy.commit", sink=self.name)
            seen.append(active())
            return super().commit(txn_id)

    metrics = InMemoryMetrics()
    cycle = CommitCycle("pipe", [Spy("a", MemoryStore())], MemoryProgressLog(), metrics=metrics)
    cycle.start()
    cycle.run_epoch(0, {"a": []})
    # A sink reports through the running cycle's metrics, with the pipeline label.
    assert metrics.value("spy.commit", pipeline="pipe", sink="a") == 1
    assert isinstance(active(), NullMetrics)  # reset when run_epoch returned
    # Another thread does not inherit it, unless it runs in a copy of the context.
    with activate(metrics):
        other: list[object] = []
        t = threading.Thread(target=lambda: other.append(active()))
        t.start()
        t.join()
        copied = contextvars.copy_context().run(active)
    assert isinstance(other[0], NullMetrics) and copied is metrics


def test_a_cycle_reports_outcomes_gauges_and_recovery_by_pipeline() -> None:
    metrics = InMemoryMetrics()
    plan = FaultPlan([Fault("cycle.begin", FaultKind.FATAL, nth=3)])
    store = MemoryStore()
    progress = MemoryProgressLog()
    cycle = CommitCycle("shop", [MemorySink("a", store)], progress, metrics=metrics, faults=plan)
    cycle.start()
    assert metrics.durations("cycle.start", pipeline="shop")
    assert metrics.gauge("cycle.last_committed_epoch", pipeline="shop") is None  # nothing yet
    for epoch in (0, 1):
        assert cycle.run_epoch(epoch, {"a": [{"k": epoch}]}) == CommitSucceeded(epoch)
    fatal = cycle.run_epoch(2, {"a": [{"k": 2}]})
    assert isinstance(fatal, CommitFatal) and fatal.step == "begin"
    assert cycle.run_epoch(1, {"a": [{"k": 1}]}).replayed  # type: ignore[union-attr]
    assert metrics.value("cycle.outcome.CommitSucceeded", pipeline="shop") == 3
    assert metrics.value("cycle.outcome.CommitFatal", pipeline="shop", step="begin") == 1
    assert metrics.gauge("cycle.last_committed_epoch", pipeline="shop") == 1
    stamp = metrics.gauge("cycle.last_commit_time", pipeline="shop")
    assert stamp is not None and stamp > 0
    # A restart reports the newest committed epoch from the log at once.
    again = InMemoryMetrics()
    CommitCycle("shop", [MemorySink("a", store)], progress, metrics=again).start()
    assert again.gauge("cycle.last_committed_epoch", pipeline="shop") == 1
    assert again.value("recovery.committed", pipeline="shop") == 0


def test_a_sink_retry_is_counted_by_sink() -> None:
    metrics = InMemoryMetrics()
    plan = FaultPlan([Fault("sink.b.commit", FaultKind.RETRYABLE)])
    from reconcile.engine.faults import FaultySink

    store = MemoryStore()
    sinks = [MemorySink("a", store), FaultySink(MemorySink("b", store), plan)]
    cycle = CommitCycle("shop", sinks, MemoryProgressLog(), metrics=metrics)
    cycle.start()
    assert cycle.run_epoch(0, {}) == CommitSucceeded(0)
    assert metrics.value("sink.commit.retryable", pipeline="shop", sink="b") == 1
    assert metrics.value("sink.commit.retryable", sink="a") == 0


def test_record_drift_reports_the_latest_finding_and_counts_repairs() -> None:
    m = InMemoryMetrics()
    record_drift("shop", "lines", missing=3, extra=1, changed=2, metrics=m)
    record_drift("shop", "lines", missing=3, extra=1, changed=2, applied=6, metrics=m)
    record_drift("shop", "lines", missing=0, extra=0, changed=0, metrics=m)
    assert m.gauge("drift.found", pipeline="shop", table="lines", kind="missing") == 0
    assert m.value("drift.repaired", pipeline="shop", table="lines") == 6
    assert m.value("drift.checks", table="lines", result="drift") == 2
    assert m.value("drift.checks", table="lines", result="clean") == 1
    with pytest.raises(ValueError, match="negative"):
        record_drift("shop", "lines", missing=-1, extra=0, changed=0, metrics=m)
    # Without metrics it goes to the active ones.
    with activate(m):
        record_drift("shop", "totals", missing=1, extra=0, changed=0)
    assert m.gauge("drift.found", pipeline="shop", table="totals", kind="missing") == 1


def test_a_fatal_outcome_of_a_sink_is_counted_as_fatal() -> None:
    class Refuses(MemorySink):
        def prepare(self, txn_id: SinkTxnId) -> SinkOutcome:
            return Fatal("bad row")

    metrics = InMemoryMetrics()
    cycle = CommitCycle("shop", [Refuses("a", MemoryStore())], MemoryProgressLog(), metrics=metrics)
    cycle.start()
    result = cycle.run_epoch(0, {"a": [{"k": 1}]})
    assert isinstance(result, CommitFatal) and not result.restart
    assert metrics.value("cycle.outcome.CommitFatal", pipeline="shop", step="prepare") == 1
    assert metrics.gauge("cycle.last_committed_epoch", pipeline="shop") is None


def test_record_report_takes_a_recovery_report() -> None:
    report = ReconcileReport(
        table="lines",
        mode="full",
        reason="requested",
        target_epoch=9,
        rows_pulled=100,
        buckets_compared=0,
        buckets_differing=0,
        missing=2,
        extra=0,
        changed=1,
        applied=3,
        seconds=0.25,
        dry_run=False,
    )
    m = InMemoryMetrics()
    record_report("shop", report, metrics=m)
    assert m.gauge("drift.found", pipeline="shop", table="lines", kind="changed") == 1
    assert m.value("drift.repaired", pipeline="shop", table="lines") == 3
    assert m.durations("drift.seconds", pipeline="shop", table="lines") == [0.25]
