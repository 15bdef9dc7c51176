"""The sink contract suite, for sink authors: run it on your sink with one call.

``check_sink(harness)`` runs every rule of the TwoPhaseSink contract and every
row of the failure matrix against a sink, through a harness that builds fresh
sink clients over one external system and reads that system directly::

    from reconcile.testing import check_sink

    class MyHarness:
        kind = "mine"
        def new_sink(self, name): ...      # a fresh client, as a restarted process builds
        def committed(self, name): ...     # epoch -> EVERY committed row write, read directly
        def prepared(self, name): ...      # txns held prepared, read directly

    check_sink(MyHarness)                  # a factory: called once per check

It is the same suite the built-in sinks pass. The rows it writes are dicts
``{"k": str, "v": int}``; ``committed`` must report every write the system
committed (a row written twice appears twice), not the current keyed state,
or the suite is blind to duplicates.
"""

from __future__ import annotations

import tempfile
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from reconcile.engine.faults import Fault
from reconcile.testing.contract import CONTRACT_CHECKS, ContractCheckError, expect
from reconcile.testing.harness import SinkHarness, epoch_problems, rows_for
from reconcile.testing.matrix import MATRIX, run_row
from reconcile.testing.scenario import Scenario, assert_invariants

__all__ = [
    "CONTRACT_CHECKS",
    "MATRIX",
    "CheckReport",
    "ContractCheckError",
    "Scenario",
    "SinkHarness",
    "assert_invariants",
    "check_sink",
    "epoch_problems",
    "expect",
    "rows_for",
    "run_row",
]


@dataclass
class CheckReport:
    """What ``check_sink`` ran: every check by name, and what failed and why."""

    passed: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.failed


def _contract_run(
    check: Callable[[SinkHarness], None],
) -> Callable[[SinkHarness, Path], None]:
    def run(harness: SinkHarness, state_dir: Path) -> None:
        check(harness)

    return run


def _matrix_run(row: str, faults: list[Fault]) -> Callable[[SinkHarness, Path], None]:
    def run(harness: SinkHarness, state_dir: Path) -> None:
        run_row(harness, row, faults, state_dir)

    return run


def check_sink(
    harness: Callable[[], SinkHarness], *, matrix: bool = True, raise_on_failure: bool = True
) -> CheckReport:
    """Run the contract checks and (``matrix``) the failure matrix on a sink.

    Args:
        harness: makes a harness over a FRESH, empty external system; called
            once per check, so that checks do not see each other's epochs.
        matrix: also run every row of the failure matrix (a few seconds per row
            for a sink over a network).
        raise_on_failure: raise ContractCheckError listing every failed check.

    Returns:
        The report (when nothing failed, or ``raise_on_failure`` is False).

    Raises:
        ContractCheckError: naming each failed check and the rule it broke.
    """
    report = CheckReport()
    runs: list[tuple[str, Callable[[SinkHarness, Path], None]]] = [
        (check.__name__, _contract_run(check)) for check in CONTRACT_CHECKS
    ]
    if matrix:
        runs += [(f"matrix:{row}", _matrix_run(row, faults)) for row, faults in MATRIX]
    for name, run in runs:
        with tempfile.TemporaryDirectory(prefix="reconcile-check-") as tmp:
            try:
                run(harness(), Path(tmp) / "state")
            except Exception as exc:
                detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
                report.failed[name] = detail
            else:
                report.passed.append(name)
    if report.failed and raise_on_failure:
        lines = "\n".join(f"  {name}: {why}" for name, why in report.failed.items())
        raise ContractCheckError(f"{len(report.failed)} of {len(runs)} checks failed:\n{lines}")
    return report
