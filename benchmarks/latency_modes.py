"""The latency benchmark's hand-written write modes, each one Spark driver process.

``python -m benchmarks.latency_modes MODE WORKDIR --epochs E [--trigger S]
[--checkpoint-interval C] [--master M]``, with the sink database's DSN in
``BENCH_DSN`` (kept off the command line, where ``ps`` shows it). The parent
(``benchmarks.latency``) drops lineitem files into ``WORKDIR/inbox``; this
process streams them (one file per micro-batch) into ``demo_lineitem`` and
``demo_customer_revenue`` and exits once micro-batch ``E - 1`` is visible.
The third mode, pull-and-diff, is the demo's own pipeline process
(``reconcile.demo.tpch.pipeline``), started by the parent unchanged.

MODE is one of:

- ``at_least_once``: ``foreachBatch`` writes the batch in one transaction and
  COMMITs: the lines upserted (COPY into a temporary table, then
  ``INSERT ... ON CONFLICT DO UPDATE``), the batch's per-customer revenue and
  line count ADDED to the totals. Nothing guards a replay: a batch run again
  after a crash (Spark re-runs a batch whose commit-log entry is missing)
  adds its totals a second time.
- ``two_phase``: checkpoint-bound two-phase commit, as a Flink sink does it.
  ``foreachBatch`` writes the same lines in one transaction that ends with
  ``PREPARE TRANSACTION 'bench_<db>_<batch>'`` (durable, invisible), and a
  checkpoint thread ``COMMIT PREPARED``s every prepared batch each
  ``--checkpoint-interval`` seconds: results become visible when a checkpoint
  completes. A replayed batch whose gid is prepared, or recorded as committed
  (the gid is inserted into ``bench_2pc_batches`` inside the prepared
  transaction), is skipped; a restart commits every prepared gid first.

  The revenue totals differ in HOW they are written, not in what ends up in
  the table: the prepared transaction inserts the batch's per-customer deltas
  into ``bench_2pc_revenue_delta``, and the checkpoint folds the committed
  deltas into ``demo_customer_revenue`` (adding, and deleting them, in one
  transaction). Adding straight into the totals inside the prepared
  transaction (``--revenue upsert``, kept for comparison) leaves the
  customers' rows locked by a prepared transaction until the next
  checkpoint: the next batch, which shares customers with it, waits on those
  locks, and the stream runs one batch per checkpoint interval.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import threading
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
import pyarrow.csv as pacsv  # type: ignore[import-untyped, unused-ignore]
from psycopg import sql

from reconcile.core import hooks
from sinks.postgres.apply import write_csv

__all__ = ["BATCH_WRITTEN", "CHECKPOINT_COMMITTED", "MODES", "main"]

MODES = ("at_least_once", "two_phase")

# Kill points (``RECONCILE_KILL_AT=<point>:<nth>``, as for the engine's own):
# after a batch's COMMIT (at_least_once) or PREPARE (two_phase), before Spark's
# commit log; after a checkpoint's COMMIT PREPARED, before the fold of its deltas.
BATCH_WRITTEN = hooks.declare("bench.batch.written")
CHECKPOINT_COMMITTED = hooks.declare("bench.checkpoint.committed")

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


def _copy(cur: psycopg.Cursor[Any], table: sql.Composable, data: pa.Table) -> None:
    """COPY ``data`` into ``table`` as CSV (Arrow's writer: no per-row Python)."""
    buffer = io.BytesIO()
    write_csv(data, buffer, pacsv.WriteOptions(include_header=False))
    query = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT CSV)").format(
        table, sql.SQL(", ").join(map(sql.Identifier, data.column_names))
    )
    with cur.copy(query) as copy:
        copy.write(buffer.getvalue())


def _upsert_lines(cur: psycopg.Cursor[Any], stage: sql.Composable, columns: list[str]) -> None:
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


def _add_revenue(cur: psycopg.Cursor[Any], source: sql.Composable) -> None:
    """Add per-customer deltas (``source``: o_custkey, revenue, lines, _epoch) to the totals."""
    cur.execute(
        sql.SQL(
            "INSERT INTO public.demo_customer_revenue AS t (o_custkey, revenue, lines, _epoch) "
            "{source} ON CONFLICT (o_custkey) DO UPDATE SET "
            "revenue = t.revenue + EXCLUDED.revenue, lines = t.lines + EXCLUDED.lines, "
            "_epoch = EXCLUDED._epoch"
        ).format(source=source)
    )


class Batches:
    """The ``foreachBatch`` function of both modes, and what it has made visible."""

    def __init__(self, dsn: str, mode: str, revenue: str) -> None:
        self.dsn, self.mode, self.revenue = dsn, mode, revenue
        self.orders: Any = None  # orders (o_orderkey, o_custkey), cached: set once Spark is up
        self.conn = psycopg.connect(dsn, autocommit=True, application_name=f"bench:{mode}")
        self.dbname = str(self.conn.info.dbname)
        self.visible = -1  # the highest batch id visible in the sink (committed)
        self.called = -1  # the highest batch id written (prepared, for two-phase)
        # The checkpoint's own session: a checkpoint never waits for a batch's write.
        self.commits = psycopg.connect(dsn, autocommit=True, application_name="bench:checkpoint")
        if mode == "at_least_once":
            # Made once per session; ON COMMIT DELETE ROWS empties it after each batch.
            self.conn.execute(
                "CREATE TEMP TABLE stage_lines (LIKE public.demo_lineitem) ON COMMIT DELETE ROWS"
            )
            self.conn.execute(
                "CREATE TEMP TABLE stage_revenue (o_custkey bigint, revenue numeric(18,4), "
                "lines bigint, _epoch bigint) ON COMMIT DELETE ROWS"
            )
        else:
            for statement in TWO_PHASE_SQL:
                self.conn.execute(statement.encode())

    def all_visible(self, rows: int) -> bool:
        """Whether every one of the feed's ``rows`` lines is visible.

        Counted, not inferred from the batch id: after a restart Spark may put
        two files in one micro-batch (seen in a crash run), and the last batch
        id is then one short of the file count.
        """
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            found = conn.execute("SELECT count(*) FROM public.demo_lineitem").fetchone()
        return bool(found and found[0] >= rows)

    def gid(self, batch_id: int) -> str:
        return f"bench_{self.dbname}_{batch_id}"

    def rows(self, batch: Any, batch_id: int) -> tuple[pa.Table, pa.Table]:
        """The batch's lines and its per-customer revenue delta, on the driver (Arrow)."""
        from pyspark.sql import functions as F

        lines = batch.withColumn("_epoch", F.lit(batch_id).cast("long"))
        delta = (
            batch.join(self.orders, batch.l_orderkey == self.orders.o_orderkey)
            .groupBy("o_custkey")
            .agg(
                F.sum(F.col("l_extendedprice") * (F.lit(1) - F.col("l_discount")))
                .cast("decimal(18,4)")
                .alias("revenue"),
                F.count("*").cast("long").alias("lines"),
            )
            .withColumn("_epoch", F.lit(batch_id).cast("long"))
        )
        return lines.toArrow(), delta.select(*REVENUE_COLUMNS).toArrow()

    def __call__(self, batch: Any, batch_id: int) -> None:
        self.called = max(self.called, batch_id)
        lines, delta = self.rows(batch, batch_id)
        if self.mode == "at_least_once":
            self.at_least_once(batch_id, lines, delta)
        else:
            self.two_phase(batch_id, lines, delta)
        hooks.point(BATCH_WRITTEN)

    def at_least_once(self, batch_id: int, lines: pa.Table, delta: pa.Table) -> None:
        with self.conn.transaction(), self.conn.cursor() as cur:
            _copy(cur, sql.Identifier("stage_lines"), lines)
            _upsert_lines(cur, sql.Identifier("stage_lines"), lines.column_names)
            _copy(cur, sql.Identifier("stage_revenue"), delta)
            _add_revenue(cur, sql.SQL("SELECT * FROM stage_revenue"))
        self.visible = max(self.visible, batch_id)

    def two_phase(self, batch_id: int, lines: pa.Table, delta: pa.Table) -> None:
        gid = self.gid(batch_id)
        stage = sql.SQL("public.bench_2pc_stage_lines")
        with self.conn.cursor() as cur:
            seen = cur.execute(
                "SELECT EXISTS (SELECT 1 FROM pg_prepared_xacts WHERE gid = %s) "
                "OR EXISTS (SELECT 1 FROM public.bench_2pc_batches WHERE gid = %s)",
                (gid, gid),
            ).fetchone()
            if seen and seen[0]:
                return  # a replay of a batch prepared (or committed) already
            cur.execute("BEGIN")
            try:
                _copy(cur, stage, lines)
                _upsert_lines(cur, stage, lines.column_names)
                # Only this transaction's rows are visible to it: the staged rows of
                # other prepared batches are uncommitted (and deleted) already.
                cur.execute(sql.SQL("DELETE FROM {}").format(stage))
                deltas = sql.SQL("public.bench_2pc_revenue_delta")
                _copy(cur, deltas, delta.append_column("gid", pa.array([gid] * delta.num_rows)))
                if self.revenue == "upsert":
                    # Into the totals now: their rows stay locked until COMMIT PREPARED.
                    _add_revenue(cur, sql.SQL(
                        "SELECT o_custkey, revenue, lines, _epoch FROM {} WHERE gid = {}"
                    ).format(deltas, sql.Literal(gid)))  # fmt: skip
                    cur.execute(sql.SQL("DELETE FROM {} WHERE gid = %s").format(deltas), (gid,))
                cur.execute(
                    "INSERT INTO public.bench_2pc_batches (gid, batch_id) VALUES (%s, %s)",
                    (gid, batch_id),
                )
                cur.execute(sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(gid)))
            except BaseException:
                cur.execute("ROLLBACK")
                raise

    def checkpoint(self) -> list[int]:
        """COMMIT PREPARED every prepared batch of this database, then fold their deltas.

        Returns the batch ids committed. The fold runs in one REPEATABLE READ
        transaction, so the deltas it adds are exactly the ones it deletes (a
        batch being prepared meanwhile is invisible to it; only this thread
        commits prepared batches, and it is here).
        """
        committed: list[int] = []
        with self.commits.cursor() as cur:
            gids = cur.execute(
                "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() "
                "AND gid LIKE %s ORDER BY prepared",
                (f"bench\\_{self.dbname}\\_%",),
            ).fetchall()
            for (gid,) in gids:
                cur.execute(sql.SQL("COMMIT PREPARED {}").format(sql.Literal(gid)))
                committed.append(int(gid.rsplit("_", 1)[1]))
                hooks.point(CHECKPOINT_COMMITTED)
            with self.commits.transaction():
                cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                pending = cur.execute(
                    "SELECT count(*) FROM public.bench_2pc_revenue_delta"
                ).fetchone()
                if pending and pending[0]:
                    _add_revenue(cur, sql.SQL(
                        "SELECT o_custkey, sum(revenue), sum(lines), max(_epoch) "
                        "FROM public.bench_2pc_revenue_delta GROUP BY o_custkey"))  # fmt: skip
                    cur.execute("DELETE FROM public.bench_2pc_revenue_delta")
            done = cur.execute("SELECT max(batch_id) FROM public.bench_2pc_batches").fetchone()
        if done and done[0] is not None:
            self.visible = max(self.visible, int(done[0]))
        return committed


class Checkpointer(threading.Thread):
    """Completes a checkpoint every ``interval`` seconds: the prepared batches become visible."""

    def __init__(self, batches: Batches, interval: float) -> None:
        super().__init__(daemon=True, name="bench-checkpoint")
        self.batches, self.interval = batches, interval
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        while not self.stop.wait(self.interval):
            try:
                self.batches.checkpoint()
            except BaseException as exc:  # reported by the main thread, which exits
                self.error = exc
                return


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=MODES)
    parser.add_argument("workdir", type=Path)
    parser.add_argument("--epochs", type=int, required=True)
    parser.add_argument(
        "--rows",
        type=int,
        default=0,
        help="lineitem rows of the whole feed (0: done at batch EPOCHS - 1)",
    )
    parser.add_argument("--trigger", type=float, default=1.0, help="processingTime, seconds")
    parser.add_argument("--checkpoint-interval", type=float, default=1.0)
    parser.add_argument("--revenue", choices=("fold", "upsert"), default="fold")
    parser.add_argument("--master", default="local[2,4]")
    args = parser.parse_args(argv)
    dsn = os.environ["BENCH_DSN"]
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    from reconcile.demo.tpch.data import LINEITEM_SPARK_SCHEMA
    from reconcile.demo.tpch.pipeline import await_progress, batch_progress
    from reconcile.spark.session import local_session

    batches = Batches(dsn, args.mode, args.revenue)
    checkpointer: Checkpointer | None = None
    if args.mode == "two_phase":
        # A restart first completes what the last run prepared (complete batches),
        # before Spark starts, as the pull-and-diff pipeline recovers before it does.
        batches.checkpoint()
    # The Spark session exactly as the demo pipeline's (the pull-and-diff mode).
    spark = local_session(
        f"bench-latency-{args.mode}",
        args.master,
        **{
            "spark.sql.shuffle.partitions": "2",
            "spark.sql.adaptive.enabled": "false",
            "spark.sql.streaming.numRecentProgressUpdates": "100000",
        },
    )
    spark.sparkContext.setLogLevel("ERROR")
    orders = (
        spark.read.parquet(str(args.workdir / "tpch" / "orders.parquet"))
        .select("o_orderkey", "o_custkey")
        .cache()
    )
    batches.orders = orders
    if args.mode == "two_phase":
        checkpointer = Checkpointer(batches, args.checkpoint_interval)
        checkpointer.start()
    last = args.epochs - 1
    # A restart may take two files into one micro-batch, so batch ids and files part.
    resumed = (args.workdir / "checkpoint").exists()
    query = None
    seen = batches.visible
    finished = batches.visible >= (0 if args.rows else last) and (
        not args.rows or batches.all_visible(args.rows)
    )
    if not finished:
        lines = (
            spark.readStream.schema(LINEITEM_SPARK_SCHEMA)
            .option("maxFilesPerTrigger", 1)
            .parquet(str(args.workdir / "inbox"))
        )
        stream = lines.writeStream.foreachBatch(batches).option(
            "checkpointLocation", str(args.workdir / "checkpoint")
        )
        if args.trigger:
            stream = stream.trigger(processingTime=f"{args.trigger} seconds")
        query = stream.queryName(f"bench_{args.mode}").start()
    try:
        while query is not None and query.isActive and not finished:
            query.awaitTermination(0.05)
            if batches.visible != seen:  # a batch became visible: is it all there?
                seen = batches.visible
                # The count reads the whole table: only where it can be true (the
                # last batch id, or after a restart), so that it does not take the
                # CPU from the batches of a stream that runs as fast as it goes.
                if args.rows and (seen >= last or resumed):
                    finished = batches.all_visible(args.rows)
                else:
                    finished = not args.rows and seen >= last
            if checkpointer is not None and checkpointer.error is not None:
                raise RuntimeError(f"checkpoint failed: {checkpointer.error}")
        if query is not None and query.exception() is not None:
            raise RuntimeError(f"the streaming query failed: {query.exception()}")
    finally:
        if query is not None:
            await_progress(query, batches.called)
            progress = batch_progress(query)
            query.stop()
            out = args.workdir / "progress" / f"{os.getpid()}.json"
            out.parent.mkdir(exist_ok=True)
            out.write_text(json.dumps(progress))
        if checkpointer is not None:
            checkpointer.stop.set()
            checkpointer.join()
    # Every batch is visible: nothing stays prepared (the last checkpoint committed it).
    batches.conn.close()
    batches.commits.close()
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
