"""The failure matrix as data: one row per step of the commit cycle and way it can fail.

Every row injects its faults (exceptions, Retryable and Fatal outcomes, simulated
crashes) at named points of the cycle or of a sink, during epoch 1, after
epoch 0 went through cleanly. :func:`run_row` drives a two-sink pipeline
through it and checks every invariant on the sinks' own state.
"""

from __future__ import annotations

from pathlib import Path

from reconcile.engine.faults import Fault, FaultKind, FaultPlan
from reconcile.testing.contract import expect
from reconcile.testing.harness import SinkHarness
from reconcile.testing.scenario import Scenario

__all__ = ["EPOCHS", "MATRIX", "run_row"]

EPOCHS = [0, 1, 2, 3]
X, R, F, C = FaultKind.EXCEPTION, FaultKind.RETRYABLE, FaultKind.FATAL, FaultKind.CRASH

# (failure-matrix row, faults). Faults fire on the 2nd hit of their point, so
# during epoch 1, after epoch 0 went through cleanly.
MATRIX: list[tuple[str, list[Fault]]] = []  # (row name, faults)


def _row(row: str, *faults: Fault) -> None:
    MATRIX.append((row, list(faults)))


for kind in (X, R, F, C):
    _row(f"begin-{kind.value}", Fault("cycle.begin", kind, nth=2))
    _row(f"stage-{kind.value}", Fault("cycle.stage", kind, nth=2))
    _row(f"stage-sink-{kind.value}", Fault("sink.beta.stage", kind, nth=2))
    _row(f"record_expected_state-{kind.value}", Fault("cycle.record_progress", kind, nth=2))
    _row(f"prepare-{kind.value}", Fault("cycle.prepare", kind, nth=2))
    _row(f"prepare-sink-{kind.value}", Fault("sink.beta.prepare", kind, nth=2))
    _row(f"finalize-{kind.value}", Fault("cycle.finalize", kind, nth=2))
    _row(f"engine_crash-recover-{kind.value}", Fault("sink.alpha.recover", kind, nth=1))
# commit, definite failure: the commit point refused, or a sink refusing its commit.
_row("commit-definite-progress-retryable", Fault("cycle.commit_progress", R, nth=2))
_row("commit-definite-progress-fatal", Fault("cycle.commit_progress", F, nth=2))
_row("commit-definite-sink-retryable", Fault("sink.beta.commit", R, nth=2))
_row("commit-definite-sink-retryable-persistent", Fault("sink.beta.commit", R, nth=2, times=4))
_row("commit-definite-sink-fatal", Fault("sink.beta.commit", F, nth=2))
# commit, ambiguous: the outcome is unknown to the caller.
_row("commit-ambiguous-progress-exception", Fault("cycle.commit_progress", X, nth=2))
_row(
    "commit-ambiguous-progress-written-reply-lost",
    Fault("cycle.commit_progress", X, nth=2, when="after"),
)
_row("commit-ambiguous-sink-reply-lost", Fault("sink.beta.commit", X, nth=2, when="after"))
_row("commit-ambiguous-sink-not-sent", Fault("sink.beta.commit", X, nth=2))
# after commit, before ack: crash once the sink commit took effect.
_row("after_commit_before_ack-sink", Fault("sink.alpha.commit", C, nth=2, when="after"))
_row("after_commit_before_ack-both", Fault("sink.beta.commit", C, nth=2, when="after"))
_row("after_commit_before_ack-progress", Fault("cycle.commit", C, nth=2))
# engine crash anywhere: kill the engine between steps and inside sink operations.
for point in ("cycle.stage", "cycle.record_progress", "cycle.prepare", "cycle.commit_progress"):
    _row(f"engine_crash-{point}", Fault(point, C, nth=2))
_row("engine_crash-after-prepare", Fault("sink.alpha.prepare", C, nth=2, when="after"))
_row(
    "engine_crash-after-commit-progress",
    Fault("cycle.commit_progress", C, nth=2, when="after"),
)
_row("engine_crash-after-record-progress", Fault("cycle.record_progress", C, nth=2, when="after"))
_row("engine_crash-during-start", Fault("sink.beta.recover", C, nth=1))
# A failed abort after a failed prepare leaves a prepared txn; retry and recovery clear it.
_row(
    "prepare-then-abort-fails",
    Fault("sink.beta.prepare", R, nth=2),
    Fault("sink.alpha.abort", X, nth=1),
)
_row(
    "prepare-then-crash-in-abort",
    Fault("sink.beta.prepare", F, nth=2),
    Fault("sink.alpha.abort", C, nth=1),
)


def run_row(
    harness: SinkHarness,
    row: str,
    faults: list[Fault],
    state_dir: Path,
    *,
    expected_root: Path | str | None = None,
) -> None:
    """Run one row of the matrix over ``harness`` and check every invariant.

    With ``expected_root``, the pipeline records its expected state there (and
    every sink must end holding exactly what it recorded).

    Raises:
        ContractCheckError: a planned fault never fired, an epoch did not
            commit, or an invariant does not hold (the message says which).
    """
    plan = FaultPlan([Fault(f.point, f.kind, f.nth, f.when, f.times) for f in faults])
    scenario = Scenario(harness, state_dir, plan, expected_root=expected_root)
    report = scenario.run(EPOCHS)
    expect(plan.all_fired, f"{row}: a fault never fired: {plan.log}")
    expect(report.committed_epochs == EPOCHS, f"{row}: committed {report.committed_epochs}")
    scenario.check(EPOCHS)
