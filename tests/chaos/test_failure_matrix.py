"""The failure matrix, row by row: inject each fault, restart, assert the invariants."""

from __future__ import annotations

from pathlib import Path

import pytest

from reconcile.core.contract import (
    OK,
    Fatal,
    FencedError,
    OutcomeUnknownError,
    SinkTxnId,
    WriterIdentity,
)
from reconcile.core.progress import EpochStatus
from reconcile.engine.cycle import CommitCycle, CommitFatal, CommitSucceeded
from reconcile.engine.faults import Fault, FaultKind, FaultPlan
from reconcile.engine.progress_file import FileProgressLog
from reconcile.testing.harness import SinkHarness, epoch_problems, rows_for
from reconcile.testing.matrix import MATRIX, run_row
from reconcile.testing.scenario import PIPELINE, SINKS, Scenario
from sinks.base import bind_writer

pytestmark = [pytest.mark.chaos, pytest.mark.integration]


X, R, F, C = FaultKind.EXCEPTION, FaultKind.RETRYABLE, FaultKind.FATAL, FaultKind.CRASH


@pytest.mark.parametrize(("row", "faults"), MATRIX, ids=[r for r, _ in MATRIX])
def test_failure_matrix(
    row: str, faults: list[Fault], sink_harness: SinkHarness, tmp_path: Path
) -> None:
    # run_row copies the row's faults: a shared Fault's `fired` count from an
    # earlier sink kind would make "every fault fired" true without firing.
    run_row(sink_harness, row, faults, tmp_path / "state")


def test_commit_reply_lost_is_not_recommitted(sink_harness: SinkHarness, tmp_path: Path) -> None:
    # The sink committed and the reply was lost: the retry finds it committed.
    plan = FaultPlan([Fault("sink.alpha.commit", X, nth=1, when="after")])
    scenario = Scenario(sink_harness, tmp_path / "state", plan)
    cycle = scenario.build()
    cycle.start()
    assert cycle.run_epoch(0, scenario.outputs(0)) == CommitSucceeded(0)
    assert plan.all_fired
    held = sink_harness.committed("alpha")
    assert list(held) == [0] and epoch_problems(0, held[0]) == []
    cycle.close()


def test_zombie_writer_is_fenced(sink_harness: SinkHarness, tmp_path: Path) -> None:
    scenario = Scenario(sink_harness, tmp_path / "state")
    zombie = scenario.build()
    zombie.start()
    assert zombie.run_epoch(0, scenario.outputs(0)) == CommitSucceeded(0)
    successor = scenario.build()
    successor.start()  # takes over: a newer generation
    late = zombie.run_epoch(1, {n: [{"k": "e1-zombie", "v": -1}] for n in SINKS})
    assert isinstance(late, CommitFatal) and not late.restart
    assert isinstance(late.error, FencedError), late
    assert successor.run_epoch(1, scenario.outputs(1)) == CommitSucceeded(1)
    for name in SINKS:
        held = sink_harness.committed(name)
        assert sorted(held) == [0, 1]
        assert epoch_problems(0, held[0]) + epoch_problems(1, held[1]) == []
    # A zombie that skips the log and goes straight to a sink is fenced there too:
    # at prepare, or (a sink whose fence is checked at commit) at commit.
    sink = sink_harness.new_sink("alpha")
    stale = SinkTxnId(PIPELINE, "alpha", 2, zombie.generation or 0)
    assert sink.stage(stale, [{"k": "e2-zombie", "v": -1}]) == OK
    prepared = sink.prepare(stale)
    outcome = sink.commit(stale) if prepared else prepared
    assert isinstance(outcome, Fatal), outcome
    assert 2 not in sink_harness.committed("alpha")
    for cycle in (zombie, successor):
        cycle.close()
    close = getattr(sink, "close", None)
    if close is not None:
        close()


def test_zombie_progress_write_raises_fenced(tmp_path: Path) -> None:
    old = FileProgressLog(tmp_path, PIPELINE)
    gen = old.claim_generation()
    FileProgressLog(tmp_path, PIPELINE).claim_generation()
    with pytest.raises(FencedError):
        old.mark(0, EpochStatus.DECIDED, gen)


def test_stranded_txn_of_truncated_epoch_is_reported_not_guessed(
    durable_sink_harness: SinkHarness, tmp_path: Path
) -> None:
    # The UNKNOWN branch of start(): a txn really prepared in the sink, whose
    # epoch the log no longer knows (truncated). It must be reported by name and
    # left prepared: committing could add an epoch that never passed the commit
    # point, aborting could lose one that did.
    harness = durable_sink_harness
    scenario = Scenario(harness, tmp_path / "state", sinks=["alpha"])
    cycle = scenario.build()
    cycle.start()
    for e in range(3):
        assert cycle.run_epoch(e, scenario.outputs(e)) == CommitSucceeded(e)
    cycle.close()
    log = FileProgressLog(tmp_path / "state", PIPELINE)
    log.truncate(2, cycle.generation or 0)
    assert log.status(1) is EpochStatus.UNKNOWN
    # A sink that never committed epoch 1 ("gamma"), holding it prepared: a
    # crashed writer's txn whose log entry is gone.
    sink = harness.new_sink("gamma")
    bind_writer(sink, WriterIdentity(PIPELINE, log.log_id))
    ghost = SinkTxnId(PIPELINE, "gamma", 1, cycle.generation or 0)
    assert sink.stage(ghost, rows_for(1)) == OK
    assert sink.prepare(ghost) == OK
    assert harness.prepared("gamma") == [ghost]  # really prepared, in the external system
    with pytest.raises(OutcomeUnknownError, match=str(ghost)):
        CommitCycle(PIPELINE, [harness.new_sink("gamma")], log).start()
    assert harness.prepared("gamma") == [ghost]  # left for pull-and-diff
    assert 1 not in harness.committed("gamma")
    harness_cleanup = getattr(harness, "abort_all", None)
    if harness_cleanup is not None:
        harness_cleanup()
