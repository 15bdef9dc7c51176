"""The SQL of the latency benchmark's hand-written write modes (``benchmarks.latency.modes``).

The lines are upserted from a staged copy; the revenue totals are added to
(at-least-once in the batch's transaction, two-phase at the checkpoint's fold).
"""

from __future__ import annotations

import io
from typing import Any

import psycopg
import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
import pyarrow.csv as pacsv  # type: ignore[import-untyped, unused-ignore]
from psycopg import sql

from sinks.postgres.apply import write_csv

__all__ = [
    "LINE_KEYS", "REVENUE_COLUMNS", "TWO_PHASE_SQL", "add_revenue", "copy_rows", "upsert_lines",
]  # fmt: skip

LINE_KEYS = ("l_orderkey", "l_linenumber")
REVENUE_COLUMNS = ("o_custkey", "revenue", "lines", "_epoch")

# Tables of the two-phase mode (in the run's own database). The staging table
# is a plain one, unlogged: PostgreSQL refuses to PREPARE a transaction that
# touched a temporary table.
TWO_PHASE_SQL = (
    "CREATE TABLE IF NOT EXISTS public.bench_2pc_batches (gid text PRIMARY KEY, "
    "batch_id bigint NOT NULL)",
    "CREATE TABLE IF NOT EXISTS public.bench_2pc_revenue_delta (gid text NOT NULL, "
    "o_custkey bigint NOT NULL, revenue numeric(18,4) NOT NULL, lines bigint NOT NULL, "
    "_epoch bigint NOT NULL)",
    "CREATE UNLOGGED TABLE IF NOT EXISTS public.bench_2pc_stage_lines (LIKE public.demo_lineitem)",
)


def copy_rows(cur: psycopg.Cursor[Any], table: sql.Composable, data: pa.Table) -> None:
    """COPY ``data`` into ``table`` as CSV (Arrow's writer: no per-row Python)."""
    buffer = io.BytesIO()
    write_csv(data, buffer, pacsv.WriteOptions(include_header=False))
    query = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT CSV)").format(
        table, sql.SQL(", ").join(map(sql.Identifier, data.column_names))
    )
    with cur.copy(query) as copy:
        copy.write(buffer.getvalue())


def upsert_lines(cur: psycopg.Cursor[Any], stage: sql.Composable, columns: list[str]) -> None:
    """``demo_lineitem`` := the staged lines, replacing rows with the same key."""
    names = sql.SQL(", ").join(map(sql.Identifier, columns))
    updates = sql.SQL(", ").join(
        sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(c))
        for c in columns
        if c not in LINE_KEYS
    )
    cur.execute(
        sql.SQL(
            "INSERT INTO public.demo_lineitem ({names}) SELECT {names} FROM {stage} "
            "ON CONFLICT (l_orderkey, l_linenumber) DO UPDATE SET {updates}"
        ).format(names=names, stage=stage, updates=updates)
    )


def add_revenue(cur: psycopg.Cursor[Any], source: sql.Composable) -> None:
    """Add per-customer deltas (``source``: o_custkey, revenue, lines, _epoch) to the totals."""
    cur.execute(
        sql.SQL(
            "INSERT INTO public.demo_customer_revenue AS t (o_custkey, revenue, lines, _epoch) "
            "{source} ON CONFLICT (o_custkey) DO UPDATE SET "
            "revenue = t.revenue + EXCLUDED.revenue, lines = t.lines + EXCLUDED.lines, "
            "_epoch = EXCLUDED._epoch"
        ).format(source=source)
    )
