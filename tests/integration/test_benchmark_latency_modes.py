"""The latency benchmark's two-phase mode without Spark: what a restart settles, when it resumes.

``benchmarks.latency.modes.Batches`` against a real PostgreSQL: a process
prepares a batch and dies (its connections closed, the prepared transaction
kept, as after SIGKILL); the next process's first checkpoint commits that
batch, which settles what the killed one left, and its first own batch is
visible only at the checkpoint after its own PREPARE. The restart timeline
(``benchmarks.latency.restart``) reads those steps from the event log.
"""

from __future__ import annotations

import datetime
from decimal import Decimal
from pathlib import Path

import psycopg
import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
import pytest

from benchmarks.latency.modes import Batches
from benchmarks.latency.sql import REVENUE_COLUMNS
from reconcile.demo.tpch.data import LINEITEM_COLUMNS, SINK_TABLES_SQL
from reconcile.demo.tpch.events import EventLog

pytestmark = [pytest.mark.integration]

ARROW = {"long": pa.int64(), "int": pa.int32(), "decimal(15,2)": pa.decimal128(15, 2),
         "string": pa.string(), "date": pa.date32()}  # fmt: skip
VALUES = {"long": 1, "int": 1, "decimal(15,2)": Decimal("1.50"), "string": "x",
          "date": datetime.date(1995, 3, 1)}  # fmt: skip


def batch(batch_id: int) -> tuple[pa.Table, pa.Table]:
    """One line of order ``batch_id`` and its customer's revenue delta, as the mode gets them."""
    columns = {name: pa.array([VALUES[kind]], ARROW[kind]) for name, kind, _ in LINEITEM_COLUMNS}
    columns["l_orderkey"] = pa.array([batch_id], pa.int64())
    columns["_epoch"] = pa.array([batch_id], pa.int64())
    delta = pa.table(
        [pa.array([7], pa.int64()), pa.array([Decimal("1.5000")], pa.decimal128(18, 4)),
         pa.array([1], pa.int64()), pa.array([batch_id], pa.int64())],
        names=list(REVENUE_COLUMNS),
    )  # fmt: skip
    return pa.table(columns), delta


def visible(dsn: str) -> list[int]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT l_orderkey FROM public.demo_lineitem ORDER BY 1").fetchall()
    return [int(r[0]) for r in rows]


def test_a_restart_settles_the_killed_batch_and_resumes_with_its_own(
    pg_db: str, tmp_path: Path
) -> None:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        for statement in SINK_TABLES_SQL:
            conn.execute(statement.encode())
    log = EventLog(tmp_path / "events.jsonl")

    killed = Batches(pg_db, "two_phase", "fold", log)
    killed.two_phase(0, *batch(0))  # PREPAREd: durable and invisible
    killed.conn.close()  # the process dies; its prepared transaction stays
    killed.commits.close()
    assert visible(pg_db) == []
    assert [e["event"] for e in log.read()] == []

    restarted = Batches(pg_db, "two_phase", "fold", log)
    settled = restarted.checkpoint()  # before Spark starts: what the killed one prepared
    assert settled == [0] and visible(pg_db) == [0]
    assert [e["event"] for e in log.read()] == []  # settled, not resumed
    restarted.two_phase(1, *batch(1))
    assert visible(pg_db) == [0]  # its own batch waits for the checkpoint
    assert restarted.checkpoint() == [1] and visible(pg_db) == [0, 1]
    assert [e["event"] for e in log.read()] == ["first_commit"]  # resumed: its own batch
    restarted.two_phase(2, *batch(2))
    restarted.checkpoint()
    assert [e["event"] for e in log.read()] == ["first_commit"]  # a step, logged once
    restarted.conn.close()
    restarted.commits.close()
