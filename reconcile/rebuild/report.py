"""What a rebuild, its plan or its rollback did: per table, and how long each step took."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

from reconcile.rebuild.plan import TablePlan

__all__ = ["Clock", "RebuildReport", "TableReport"]


@dataclass
class TableReport:
    """One sink table's rebuild.

    ``how``: "diff" (the two store versions' difference applied in parts),
    "full pull-and-diff" (a resume or a rollback), "planned" or "untouched".
    """

    plan: TablePlan | None = None
    store_before: int | None = None
    store_after: int | None = None
    applied: int = 0
    parts: int = 0
    how: str = "planned"


@dataclass
class RebuildReport:
    """What a plan, a rebuild or a rollback did."""

    pipeline: str
    logic_version: str
    previous: str | None
    base_epoch: int | None
    rebuild: str | None = None
    generation: int | None = None
    step: str = "planned"
    resumed: bool = False
    tables: dict[str, TableReport] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    # The app (package.module:function) the new logic ran as, kept in the
    # rebuild log: a run of that app afterwards carries the rebuild's logic.
    app: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the plan's samples as they are (keys and values of the rows)."""
        out = asdict(self)
        for name, table in self.tables.items():
            if table.plan is not None:
                out["tables"][name]["plan"]["changed"] = table.plan.changed
        return out


class Clock:
    """Adds the seconds since the last step to each step's figure."""

    def __init__(self, report: RebuildReport) -> None:
        self.report, self.last = report, time.perf_counter()

    def step(self, name: str) -> None:
        now = time.perf_counter()
        self.report.seconds[name] = round(self.report.seconds.get(name, 0.0) + now - self.last, 3)
        self.last = now
