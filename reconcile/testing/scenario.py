"""Scenario runner and the exactly-once invariants, checked on any sink harness."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from reconcile.core.contract import OK, Fatal, FatalError, SinkTxnId, WriterIdentity
from reconcile.core.progress import EpochStatus, ProgressLog
from reconcile.core.sink import bind_writer
from reconcile.engine.cycle import CommitCycle, CommitSucceeded, RecoveryReport
from reconcile.engine.driver import DriveReport, RetryPolicy, drive
from reconcile.engine.expected import ExpectedState
from reconcile.engine.faults import FaultPlan, FaultySink
from reconcile.engine.progress_file import FileProgressLog
from reconcile.testing.harness import SinkHarness, epoch_problems, rows_for

PIPELINE = "chaos"
SINKS = ("alpha", "beta")

# Chaos runs must not sleep: retry at once, and give up well before a test timeout.
FAST = RetryPolicy(give_up_after_s=60.0, initial_s=0.0, max_s=0.01, jitter_s=0.0)
# An injected Fatal outcome stops the drive (no retry can cure a real one); the
# scenario then runs the same drive again, as an operator would after a fix.
MAX_REDRIVES = 20


class Scenario:
    """A two-sink pipeline over one harness, a durable progress log and a fault plan.

    Every call of ``outputs`` is a new run of the epoch's computation and gives
    rows with a new nonce in their values, so a replay that writes anything is
    visible in the sink.
    """

    def __init__(
        self,
        harness: SinkHarness,
        state_dir: Path,
        plan: FaultPlan | None = None,
        sinks: Sequence[str] = SINKS,
        *,
        nonce_base: int = 0,
        expected_root: Path | str | None = None,
    ) -> None:
        self.harness = harness
        self.state_dir = state_dir
        self.plan = plan or FaultPlan()
        self.sink_names = tuple(sinks)
        self.runs = nonce_base
        self.redrives = 0
        # With an expected state (every sink keyed by "k"), its epochs table is
        # the progress log and the sinks must end holding exactly what it recorded.
        self.expected_root = expected_root

    def expected(self) -> ExpectedState:
        assert self.expected_root is not None
        return ExpectedState(str(self.expected_root), PIPELINE, {n: ["k"] for n in self.sink_names})

    def log(self) -> ProgressLog:
        """The progress log, reopened: the store's epochs table, or the file log."""
        if self.expected_root is not None:
            return self.expected().progress
        return FileProgressLog(self.state_dir, PIPELINE)

    def build(self) -> CommitCycle:
        """What a restarted process builds: new clients, the log reopened from disk."""
        sinks = [FaultySink(self.harness.new_sink(n), self.plan) for n in self.sink_names]
        if self.expected_root is not None:
            return _CheckedCycle(
                self, PIPELINE, sinks, expected_state=self.expected(), faults=self.plan
            )
        return _CheckedCycle(
            self, PIPELINE, sinks, FileProgressLog(self.state_dir, PIPELINE), faults=self.plan
        )

    def outputs(self, epoch: int) -> dict[str, list[dict[str, object]]]:
        self.runs += 1
        return {n: rows_for(epoch, nonce=self.runs) for n in self.sink_names}

    def run(self, epochs: Sequence[int]) -> DriveReport:
        """Drive every epoch; re-drive after a stop that an injected Fatal caused."""
        total = DriveReport()
        while True:
            try:
                report = drive(self.build, epochs, self.outputs, retry=FAST)
            except FatalError as exc:
                if "injected" not in str(exc) or self.redrives >= MAX_REDRIVES:
                    raise
                self.redrives += 1
                continue
            total.results += report.results
            total.restarts += report.restarts
            total.retries += report.retries
            # Epochs committed by a drive that a stop cut short are skipped (they
            # are in) by the drive that resumed: both count as committed.
            total.committed_epochs = sorted(
                set(report.committed_epochs) | set(report.skipped_epochs)
            )
            total.skipped_epochs = report.skipped_epochs
            return total

    def check(self, epochs: Sequence[int]) -> None:
        """Restart once more, then assert every invariant against the sinks themselves."""
        sinks = [self.harness.new_sink(n) for n in self.sink_names]
        if self.expected_root is not None:
            clean = CommitCycle(PIPELINE, sinks, expected_state=self.expected())
        else:
            clean = CommitCycle(PIPELINE, sinks, FileProgressLog(self.state_dir, PIPELINE))
        log = clean.progress
        clean.start()
        assert_invariants(self.harness, self.sink_names, epochs, log)
        if self.expected_root is not None:
            assert_sinks_hold_the_recorded_runs(self.harness, self.expected(), epochs)
        # I3, through the cycle: recovery and a replay of the newest epoch, run
        # again, change nothing (the replay's rows differ, so a write would show).
        before = {n: self.harness.committed(n) for n in self.sink_names}
        clean.start()
        last = epochs[-1]
        assert clean.run_epoch(last, self.outputs(last)) == CommitSucceeded(last, replayed=True)
        assert {n: self.harness.committed(n) for n in self.sink_names} == before
        # I3, on the sinks themselves (the log's "already finalized" shortcut
        # above calls no sink): prepare, commit and abort of a committed epoch,
        # each twice, with new rows, must leave the external state as it was.
        writer = WriterIdentity(PIPELINE, log.log_id)
        for name in self.sink_names:
            sink = self.harness.new_sink(name)
            bind_writer(sink, writer)
            txn = SinkTxnId(PIPELINE, name, last, clean.generation or 0)
            for _ in range(2):
                assert sink.stage(txn, rows_for(last, nonce=self.runs + 1)) == OK
                assert sink.prepare(txn) == OK, f"{name}: prepare of a committed epoch"
                assert sink.commit(txn) == OK, f"{name}: commit of a committed epoch"
                aborted = sink.abort(txn)
                assert isinstance(aborted, Fatal), f"{name}: abort of a committed epoch: {aborted}"
            close = getattr(sink, "close", None)
            if close is not None:
                close()
            assert self.harness.committed(name) == before[name], name
            assert self.harness.prepared(name) == [], name
        clean.close()


class _CheckedCycle(CommitCycle):
    """A cycle that checks I2 right after every recovery, before any retry can mask it."""

    def __init__(self, scenario: Scenario, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.scenario = scenario

    def start(self) -> RecoveryReport:
        report = super().start()
        log = self.scenario.log()
        for name in self.scenario.sink_names:
            for epoch in self.scenario.harness.committed(name):
                # No sink may hold an epoch that the log does not say committed.
                assert log.status(epoch) in (EpochStatus.COMMITTED, EpochStatus.FINALIZED), (
                    f"after recovery, sink {name!r} holds epoch {epoch}, which is "
                    f"{log.status(epoch)} in the progress log"
                )
            # And no prepared txn is left stranded by recovery.
            assert self.scenario.harness.prepared(name) == [], name
        return report


def assert_invariants(
    harness: SinkHarness, sinks: Sequence[str], epochs: Sequence[int], log: ProgressLog | Path
) -> None:
    """I1/I2 and the chaos invariants, for every sink, from the sinks' own state."""
    if isinstance(log, Path):
        log = FileProgressLog(log, PIPELINE)
    finalized = {e for e in epochs if log.status(e) is EpochStatus.FINALIZED}
    # Every epoch the driver saw succeed is finalized in the durable log.
    assert finalized == set(epochs), (finalized, epochs)
    for name in sinks:
        held = harness.committed(name)
        # Every committed sink row belongs to a committed epoch (I2).
        assert set(held) <= finalized, f"{name}: rows of uncommitted epochs {held.keys()}"
        # No row lost, none duplicated, none without its epoch, one run per epoch (I1).
        problems = [p for e in sorted(finalized) for p in epoch_problems(e, held.get(e, []))]
        assert not problems, f"sink {name}: {problems}"
        # No prepared txn left stranded after recovery.
        assert harness.prepared(name) == [], f"{name}: stranded {harness.prepared(name)}"


def assert_sinks_hold_the_recorded_runs(
    harness: SinkHarness, expected: ExpectedState, epochs: Sequence[int]
) -> None:
    """Every sink holds, for every epoch, exactly the rows the expected state recorded.

    Replays compute new values: a sink that got a recomputed run instead of the
    one that reached the decision differs here, even if each epoch is whole.
    """
    for name, store in expected.tables.items():
        held = harness.committed(name)
        for epoch in epochs:
            recorded = store.changes_of(epoch).drop_columns(["_op"]).to_pylist()
            got = sorted((r["k"], r["v"]) for r in held.get(epoch, []))
            want = sorted((r["k"], r["v"]) for r in recorded)
            assert got == want, f"sink {name} epoch {epoch}: holds {got}, recorded {want}"
