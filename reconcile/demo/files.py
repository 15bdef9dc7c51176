"""The smallest real end-to-end run: epochs into file sinks under seeded chaos, then an audit."""

from __future__ import annotations

import json
import random
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from reconcile.core.contract import FatalError
from reconcile.core.metrics import InMemoryMetrics
from reconcile.core.progress import EpochStatus
from reconcile.engine.cycle import CommitCycle, CommitResult, CommitSucceeded
from reconcile.engine.driver import RetryPolicy, drive
from reconcile.engine.faults import (
    CYCLE_POINTS,
    SINK_OPERATIONS,
    Fault,
    FaultKind,
    FaultPlan,
    FaultySink,
)
from reconcile.engine.progress_file import FileProgressLog
from sinks.files.sink import FileSink, read_batch

__all__ = ["DemoReport", "run_demo"]

PIPELINE = "demo"
SINKS = ("orders", "order_totals")


@dataclass
class DemoReport:
    """What the demo did and what the audit found."""

    out: str
    epochs: int
    rows_per_epoch: int
    resumed_from: int
    faults_planned: int
    faults_fired: list[str]
    restarts: int
    retries: int
    seconds: float
    audit_ok: bool
    audit_problems: list[str] = field(default_factory=list)
    rows_committed: dict[str, int] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)


def epoch_outputs(epoch: int, rows: int) -> dict[str, list[dict[str, Any]]]:
    """A deterministic epoch: ``rows`` orders, and per-customer totals of them."""
    rng = random.Random(epoch)
    orders: list[dict[str, Any]] = [
        {"k": f"e{epoch}-o{i}", "customer": rng.randrange(50), "cents": rng.randrange(100, 10**6)}
        for i in range(rows)
    ]
    totals: Counter[int] = Counter()
    for order in orders:
        totals[order["customer"]] += order["cents"]
    return {
        "orders": orders,
        "order_totals": [
            {"k": f"e{epoch}-c{c}", "customer": c, "cents": totals[c]} for c in sorted(totals)
        ],
    }


def chaos_plan(seed: int, epochs: int) -> FaultPlan:
    """Seeded faults: roughly one per three epochs, at random points and of random kinds."""
    rng = random.Random(seed)
    points = [f"cycle.{p}" for p in CYCLE_POINTS] + [
        f"sink.{s}.{op}" for s in SINKS for op in SINK_OPERATIONS if op != "recover"
    ]
    kinds = [FaultKind.EXCEPTION, FaultKind.RETRYABLE, FaultKind.FATAL, FaultKind.CRASH]
    faults = []
    for _ in range(max(1, epochs // 3)):
        kind = rng.choice(kinds)
        when: Literal["before", "after"] = "before"
        if kind in (FaultKind.EXCEPTION, FaultKind.CRASH) and rng.random() < 0.5:
            when = "after"
        faults.append(Fault(rng.choice(points), kind, nth=rng.randrange(1, epochs + 1), when=when))
    return FaultPlan(faults)


def run_demo(
    out: Path,
    *,
    epochs: int = 20,
    rows: int = 1000,
    chaos_seed: int | None = 7,
    progress: Callable[[str], None] | None = None,
) -> DemoReport:
    """Run ``epochs`` epochs into two file sinks under ``out``, resuming if it has state.

    With ``chaos_seed`` set, faults of every kind are injected (a crash throws
    the cycle and its sink clients away and restarts from what is on disk).
    The audit then reads the committed batch files directly and checks the
    invariants: every epoch exactly once, every row under its own epoch,
    nothing left prepared.
    """
    say = progress or (lambda line: print(line, file=sys.stderr))
    state, sink_root = out / "state", out / "sinks"
    plan = chaos_plan(chaos_seed, epochs) if chaos_seed is not None else FaultPlan()
    metrics = InMemoryMetrics()
    resumed_from = FileProgressLog(state, PIPELINE).last_committed() or 0

    def build() -> CommitCycle:
        sinks = [FaultySink(FileSink(name, sink_root), plan) for name in SINKS]
        return CommitCycle(
            PIPELINE, sinks, FileProgressLog(state, PIPELINE), metrics=metrics, faults=plan
        )

    def report_progress(epoch: int, result: CommitResult) -> None:
        if isinstance(result, CommitSucceeded):
            say(f"epoch {epoch + 1}/{epochs} committed{' (replay)' if result.replayed else ''}")
        else:
            say(f"epoch {epoch + 1}/{epochs}: {type(result).__name__} at {result.step}, retrying")

    started = time.perf_counter()
    # An injected Fatal outcome stops the drive, as a real one would (no retry
    # can cure it); the demo then does what an operator does after a fix: run
    # the same drive again, which resumes where it stopped.
    operator_restarts = 0
    while True:
        try:
            drive_report = drive(
                build,
                range(resumed_from, epochs),
                lambda e: epoch_outputs(e, rows),
                retry=RetryPolicy(initial_s=0.01, max_s=0.2),
                on_progress=report_progress,
            )
            break
        except FatalError as exc:
            if "injected" not in str(exc) or operator_restarts >= 10 * max(1, len(plan.faults)):
                raise
            operator_restarts += 1
            say(f"stopped: {exc}; running it again (resumes)")
    # A last restart, as after a crash at the very end, resolves anything in doubt.
    CommitCycle(
        PIPELINE, [FileSink(n, sink_root) for n in SINKS], FileProgressLog(state, PIPELINE)
    ).start()
    problems, committed = audit(out, epochs, rows)
    return DemoReport(
        out=str(out),
        epochs=epochs,
        rows_per_epoch=rows,
        resumed_from=resumed_from,
        faults_planned=len(plan.faults),
        faults_fired=plan.log,
        restarts=drive_report.restarts + operator_restarts,
        retries=drive_report.retries,
        seconds=round(time.perf_counter() - started, 3),
        audit_ok=not problems,
        audit_problems=problems,
        rows_committed=committed,
        metrics=metrics.summary(),
    )


def audit(out: Path, epochs: int, rows: int) -> tuple[list[str], dict[str, int]]:
    """Check the sinks on disk against the deterministic outputs. Returns problems, counts."""
    problems: list[str] = []
    committed: dict[str, int] = {}
    log = FileProgressLog(out / "state", PIPELINE)
    for name in SINKS:
        directory = out / "sinks" / name
        by_epoch: dict[int, list[list[Any]]] = {}
        for path in sorted((directory / "committed").glob("*.batch")):
            txn, batch = read_batch(path)
            by_epoch.setdefault(txn.epoch, []).append(batch)
        committed[name] = sum(len(b) for bs in by_epoch.values() for b in bs)
        for epoch in range(epochs):
            batches = by_epoch.pop(epoch, [])
            if len(batches) != 1:
                problems.append(f"{name}: epoch {epoch} committed {len(batches)} times")
            elif batches[0] != epoch_outputs(epoch, rows)[name]:
                problems.append(f"{name}: epoch {epoch} holds rows other than its output")
            if log.status(epoch) is not EpochStatus.FINALIZED:
                problems.append(f"epoch {epoch} is {log.status(epoch)} in the progress log")
        if by_epoch:
            problems.append(f"{name}: rows of epochs outside the run: {sorted(by_epoch)}")
        stranded = sorted(p.name for p in (directory / "prepared").glob("*.batch"))
        if stranded:
            problems.append(f"{name}: prepared batches left stranded: {stranded}")
    return problems, committed


def report_json(report: DemoReport) -> str:
    return json.dumps(asdict(report), indent=2, sort_keys=True)
