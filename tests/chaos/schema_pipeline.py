"""A pipeline whose epoch 1 adds a column, SIGKILLed between the store's commit and the sink's.

``python -m tests.chaos.schema_pipeline DSN ROOT``

Epoch 0 writes rows without ``note``; epoch 1 brings ``note``. The process dies
by SIGKILL right after the commit point of epoch 1 (the store holds the epoch
and its new column; the sink's txn, with its ``ALTER TABLE``, is not
committed). The chaos test then restarts the pipeline in its own process.
"""

from __future__ import annotations

import sys

from reconcile import CommitCycle
from reconcile.engine.expected import ExpectedState
from reconcile.engine.faults import Fault, FaultKind, FaultPlan
from sinks.postgres.factory import postgres_sink

ROWS_0 = [{"id": i, "qty": i} for i in range(1, 4)]
ROWS_1 = [{"id": 2, "qty": 20, "note": "two"}, {"id": 4, "qty": 4, "note": None}]


def cycle(dsn: str, root: str, faults: FaultPlan | None = None) -> CommitCycle:
    """The pipeline: a Postgres sink ``orders`` keyed by ``id``; its expected state at ``root``."""
    expected = ExpectedState(root, "shop", {"orders": ["id"]})
    sink = postgres_sink(dsn, "orders", name="orders")
    return CommitCycle("shop", [sink], expected_state=expected, faults=faults or FaultPlan())


def main(argv: list[str]) -> int:
    dsn, root = argv[0], argv[1]
    # The second hit of the commit_progress step, after it took effect: epoch 1
    # is recorded in the store (with its column) and decided; no sink committed it.
    plan = FaultPlan([Fault("cycle.commit_progress", FaultKind.KILL, nth=2, when="after")])
    run = cycle(dsn, root, plan)
    run.start()
    run.run_epoch(0, {"orders": ROWS_0})
    run.run_epoch(1, {"orders": ROWS_1})
    return 3  # not killed: the test fails on this exit status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
