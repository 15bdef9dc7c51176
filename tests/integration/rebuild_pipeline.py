"""A small pipeline for the rebuild tests: an input of events, two logics, one Postgres sink.

The input is a list of epochs, each a list of ``(id, qty)`` events. A logic maps
the events of an epoch to the sink's rows (``id``, ``total``, ``tag``); the
sink's state is the last row of each id, as the commit cycle keeps it. A
fresh run of a logic over every epoch is what a rebuild must converge to.
Run as a module, it rebuilds in a process of its own (the kill -9 tests):
``python -m tests.integration.rebuild_pipeline DSN ROOT LOGIC [apply|rollback]``.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import psycopg
import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]

from reconcile import CommitCycle
from reconcile.engine.expected import ExpectedState
from reconcile.rebuild import rebuild, rollback
from sinks.postgres.factory import postgres_sink

DDL = "CREATE TABLE orders (id bigint PRIMARY KEY, total bigint, tag text, _epoch bigint)"
PIPELINE = "shop"

Logic = Callable[[int, int], dict[str, Any] | None]


def v1(event_id: int, qty: int) -> dict[str, Any] | None:
    """The first logic: total = qty * 10, tag "a"."""
    return {"id": event_id, "total": qty * 10, "tag": "a"}


def v2(event_id: int, qty: int) -> dict[str, Any] | None:
    """The fixed logic: ids divisible by 7 get another total; ids divisible by 11 are dropped."""
    if event_id % 11 == 0:
        return None
    return {"id": event_id, "total": qty * 10 + (1 if event_id % 7 == 0 else 0), "tag": "a"}


LOGICS: dict[str, Logic] = {"v1": v1, "v2": v2}


def inputs(epochs: int = 3, per_epoch: int = 40) -> list[list[tuple[int, int]]]:
    """Epoch e's events: ids overlap between epochs (a later epoch updates earlier ids)."""
    return [[(i, i + e) for i in range(e * per_epoch // 2, e * per_epoch // 2 + per_epoch)]
            for e in range(epochs)]  # fmt: skip


def outputs(logic: Logic, events: Sequence[tuple[int, int]]) -> list[dict[str, Any]]:
    """One epoch's rows under ``logic`` (an event it drops gives no row)."""
    return [row for row in (logic(i, q) for i, q in events) if row is not None]


def state(logic: Logic, epochs: Sequence[Sequence[tuple[int, int]]]) -> dict[int, tuple[Any, ...]]:
    """What a fresh run of ``logic`` over ``epochs`` leaves: id -> (total, tag).

    An event the logic drops leaves the id's earlier row as it was: the sink
    holds the last row written for an id, and a dropped event writes none.
    """
    rows: dict[int, tuple[Any, ...]] = {}
    for events in epochs:
        for row in outputs(logic, events):
            rows[row["id"]] = (row["total"], row["tag"])
    return rows


def recompute(logic: Logic, epochs: Sequence[Sequence[tuple[int, int]]]) -> pa.Table:
    """The new expected state of ``orders`` under ``logic``, as the rebuild takes it."""
    rows = state(logic, epochs)
    return pa.table(
        {
            "id": pa.array(list(rows), pa.int64()),
            "total": pa.array([v[0] for v in rows.values()], pa.int64()),
            "tag": pa.array([v[1] for v in rows.values()], pa.string()),
        }
    )


def build(dsn: str, root: str, logic_version: str | None = None) -> Callable[[], CommitCycle]:
    """A ``build()`` of the pipeline's cycle, as ``reconcile run`` makes one."""

    def make() -> CommitCycle:
        expected = ExpectedState(root, PIPELINE, {"orders": ["id"]})
        sink = postgres_sink(dsn, "orders", name="orders")
        return CommitCycle(PIPELINE, [sink], expected_state=expected, logic_version=logic_version)

    return make


def run_epochs(dsn: str, root: str, logic: str, epochs: Sequence[Sequence[tuple[int, int]]],
               first: int = 0) -> None:  # fmt: skip
    """Run ``epochs`` as epochs ``first``... under ``logic``."""
    cycle = build(dsn, root, logic)()
    try:
        cycle.start()
        for n, events in enumerate(epochs):
            cycle.run_epoch(first + n, {"orders": outputs(LOGICS[logic], events)})
    finally:
        cycle.close()


def seed(dsn: str, root: str) -> tuple[str, str]:
    """The sink table, and three epochs of logic v1 in it and in the store at ``root``."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(DDL)
    run_epochs(dsn, root, "v1", inputs())
    return dsn, root


def rows_written(dsn: str) -> int:
    """Rows inserted, updated and deleted in ``orders`` so far, as Postgres counts them."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute(
            "SELECT n_tup_ins + n_tup_upd + n_tup_del FROM pg_stat_user_tables "
            "WHERE relname = 'orders'"
        ).fetchone()
    assert row is not None
    return int(row[0])


def rows_written_since(dsn: str, before: int, expected: int) -> int:
    """Rows written since ``before``, once the sessions that wrote them reported them.

    A backend sends its counters at its exit or a second after its last report:
    wait (15 s at most) until ``expected`` rows show, then say how many did.
    """
    deadline = time.monotonic() + 15
    while True:
        now = rows_written(dsn) - before
        if now >= expected or time.monotonic() > deadline:
            return now
        time.sleep(0.2)


def main(argv: list[str]) -> int:
    dsn, root, logic, what = argv[0], argv[1], argv[2], argv[3] if len(argv) > 3 else "apply"
    if what == "rollback":
        rollback(build(dsn, root))
        return 0
    epochs = inputs()
    rebuild(build(dsn, root), lambda _: recompute(LOGICS[logic], epochs), logic_version=logic,
            part_rows=int(argv[4]) if len(argv) > 4 else 10)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
