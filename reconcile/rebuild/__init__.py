"""Rebuilding a sink to new logic by diff: the plan, the rebuild, its resume and its rollback."""

from reconcile.rebuild.apply import DEFAULT_PART_ROWS
from reconcile.rebuild.plan import TablePlan, plan_table
from reconcile.rebuild.report import RebuildReport, TableReport
from reconcile.rebuild.rollback import rollback
from reconcile.rebuild.run import plan, rebuild

__all__ = [
    "DEFAULT_PART_ROWS",
    "RebuildReport",
    "TablePlan",
    "TableReport",
    "plan",
    "plan_table",
    "rebuild",
    "rollback",
]
