"""Rebuilding a sink to new logic: what the new transform changes, before anything is written."""

from reconcile.rebuild.plan import TablePlan, plan_table

__all__ = ["TablePlan", "plan_table"]
