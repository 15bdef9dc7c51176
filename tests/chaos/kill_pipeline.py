"""A file-sink pipeline run in a subprocess, SIGKILLed at a named point by the chaos suite."""

from __future__ import annotations

import sys
from pathlib import Path

from reconcile.faults import Fault, FaultKind, FaultPlan
from reconcile.progress import FileProgressLog
from tests.fix_sinks import FileHarness
from tests.invariants import PIPELINE, Scenario


def main(argv: list[str]) -> int:
    """``kill_pipeline ROOT EPOCHS [POINT NTH WHEN]``: run; die by SIGKILL at POINT."""
    root, epochs = Path(argv[0]), int(argv[1])
    plan = FaultPlan()
    if len(argv) > 2:
        point, nth, when = argv[2], int(argv[3]), argv[4]
        plan = FaultPlan([Fault(point, FaultKind.KILL, nth=nth, when=when)])  # type: ignore[arg-type]
    # Resume like Spark does: from the newest committed epoch (its replay is a
    # no-op), never from the beginning.
    last = FileProgressLog(root / "state", PIPELINE).last_committed() or 0
    Scenario(FileHarness(root / "sinks"), root / "state", plan).run(list(range(last, epochs)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
