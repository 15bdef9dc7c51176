"""Scenario runner and the exactly-once invariants, checked on any sink harness."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from reconcile.cycle import CommitCycle, CommitSucceeded, RecoveryReport
from reconcile.driver import DriveReport, drive
from reconcile.faults import FaultPlan, FaultySink
from reconcile.progress import EpochStatus, FileProgressLog
from tests.harness import SinkHarness, rows_for

PIPELINE = "chaos"
SINKS = ("alpha", "beta")


class Scenario:
    """A two-sink pipeline over one harness, a durable progress log and a fault plan."""

    def __init__(
        self,
        harness: SinkHarness,
        state_dir: Path,
        plan: FaultPlan | None = None,
        sinks: Sequence[str] = SINKS,
    ) -> None:
        self.harness = harness
        self.state_dir = state_dir
        self.plan = plan or FaultPlan()
        self.sink_names = tuple(sinks)

    def build(self) -> CommitCycle:
        """What a restarted process builds: new clients, the log reopened from disk."""
        sinks = [FaultySink(self.harness.new_sink(n), self.plan) for n in self.sink_names]
        return _CheckedCycle(
            self, PIPELINE, sinks, FileProgressLog(self.state_dir, PIPELINE), faults=self.plan
        )

    def outputs(self, epoch: int) -> dict[str, list[dict[str, object]]]:
        return {n: rows_for(epoch) for n in self.sink_names}

    def run(self, epochs: Sequence[int]) -> DriveReport:
        return drive(self.build, epochs, self.outputs, max_attempts_per_epoch=30)

    def check(self, epochs: Sequence[int]) -> None:
        """Restart once more, then assert every invariant against the sinks themselves."""
        clean = CommitCycle(
            PIPELINE,
            [self.harness.new_sink(n) for n in self.sink_names],
            FileProgressLog(self.state_dir, PIPELINE),
        )
        clean.start()
        assert_invariants(self.harness, self.sink_names, epochs, self.state_dir)
        # I3: recovery and a replay of the newest epoch, run again, change nothing.
        before = {n: self.harness.committed(n) for n in self.sink_names}
        clean.start()
        result = clean.run_epoch(epochs[-1], self.outputs(epochs[-1]))
        assert result == CommitSucceeded(epochs[-1], replayed=True)
        assert {n: self.harness.committed(n) for n in self.sink_names} == before


class _CheckedCycle(CommitCycle):
    """A cycle that checks I2 right after every recovery, before any retry can mask it."""

    def __init__(self, scenario: Scenario, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.scenario = scenario

    def start(self) -> RecoveryReport:
        report = super().start()
        log = FileProgressLog(self.scenario.state_dir, PIPELINE)
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
    harness: SinkHarness, sinks: Sequence[str], epochs: Sequence[int], state_dir: Path
) -> None:
    """I1/I2 and the chaos invariants of the core issue, for every sink."""
    log = FileProgressLog(state_dir, PIPELINE)
    committed_epochs = {e for e in epochs if log.status(e) is EpochStatus.FINALIZED}
    # Every epoch the driver saw succeed is committed in the durable log.
    assert committed_epochs == set(epochs), (committed_epochs, epochs)
    for name in sinks:
        held = harness.committed(name)
        # Every committed sink row belongs to a committed epoch.
        assert set(held) <= committed_epochs, f"{name}: rows of uncommitted epochs {held.keys()}"
        for epoch in committed_epochs:
            rows = held.get(epoch, [])
            # No row lost, none duplicated: the multiset equals the epoch's output.
            got = Counter(_freeze(r) for r in rows)
            want = Counter(_freeze(r) for r in rows_for(epoch))
            assert got == want, f"{name} epoch {epoch}: got {rows}"
            # No row appears without (or under the wrong) epoch.
            assert all(str(r["k"]).startswith(f"e{epoch}-") for r in rows)
        # No prepared txn left stranded after recovery.
        assert harness.prepared(name) == [], f"{name}: stranded {harness.prepared(name)}"


def _freeze(row: dict[str, object]) -> tuple[tuple[str, object], ...]:
    return tuple(sorted((k, v) for k, v in row.items() if not k.startswith("_")))
