"""Fixture plugin: counts what the chaos suite injected, and prints it at the end of a run.

A fault-injection run that never fired a fault proves nothing, so each
Hypothesis example asserts that its reachable faults fired, and the totals
(examples, faults planned, faults fired, by kind) are printed in the summary.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

CHAOS_TOTALS: Counter[str] = Counter()


def record(plan: Any) -> None:
    """Add one example's fault plan to the totals."""
    CHAOS_TOTALS["examples"] += 1
    for fault in plan.faults:
        CHAOS_TOTALS["faults planned"] += 1
        CHAOS_TOTALS[f"fired {fault.kind.value}"] += fault.fired
        CHAOS_TOTALS["faults fired"] += 1 if fault.fired else 0


def pytest_sessionfinish(session: pytest.Session) -> None:
    # An xdist worker hands its totals to the controller, which prints the sum.
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["chaos_totals"] = dict(CHAOS_TOTALS)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    CHAOS_TOTALS.update(getattr(node, "workeroutput", {}).get("chaos_totals", {}))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if CHAOS_TOTALS:
        shown = ", ".join(f"{k}: {v}" for k, v in sorted(CHAOS_TOTALS.items()))
        terminalreporter.write_line(f"chaos faults injected: {shown}")


@pytest.fixture
def chaos_totals() -> Counter[str]:
    return CHAOS_TOTALS
