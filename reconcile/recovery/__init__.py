"""Pull-and-diff recovery: bring a sink table to its expected state, applying only the diff."""

from reconcile.recovery.api import recover, recover_sink
from reconcile.recovery.diff import Diff, diff_tables
from reconcile.recovery.modes import Mode, choose_mode
from reconcile.recovery.report import ReconcileReport

__all__ = [
    "Diff",
    "Mode",
    "ReconcileReport",
    "choose_mode",
    "diff_tables",
    "recover",
    "recover_sink",
]
