"""The latency benchmark's hand-written write modes, each one Spark driver process.

``python -m benchmarks.latency.modes MODE WORKDIR --epochs E [--trigger S]
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

Both modes append the steps of every start to ``WORKDIR/events.jsonl`` (the
demo pipeline's event log and step names, which the benchmark's restart
timeline reads, ``benchmarks.latency.restart``): ``process``, ``settled``
(two-phase: the restart's checkpoint committed what the killed process had
prepared; at-least-once has nothing to settle), ``spark_up``, ``started``
and ``first_commit`` (the first batch this process wrote is visible: its
COMMIT, or the checkpoint's COMMIT PREPARED of a batch it prepared).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
from psycopg import sql

from benchmarks.latency.sql import (
    REVENUE_COLUMNS,
    TWO_PHASE_SQL,
    add_revenue,
    copy_rows,
    upsert_lines,
)
from reconcile.core import hooks
from reconcile.demo.tpch.events import EventLog

__all__ = ["BATCH_WRITTEN", "CHECKPOINT_COMMITTED", "MODES", "main"]

MODES = ("at_least_once", "two_phase")

# Kill points (``RECONCILE_KILL_AT=<point>:<nth>``, as for the engine's own):
# after a batch's COMMIT (at_least_once) or PREPARE (two_phase), before Spark's
# commit log; after a checkpoint's COMMIT PREPARED, before the fold of its deltas.
BATCH_WRITTEN = hooks.declare("bench.batch.written")
CHECKPOINT_COMMITTED = hooks.declare("bench.checkpoint.committed")


class Batches:
    """The ``foreachBatch`` function of both modes, and what it has made visible."""

    def __init__(self, dsn: str, mode: str, revenue: str, events: EventLog) -> None:
        self.dsn, self.mode, self.revenue, self.events = dsn, mode, revenue, events
        self.prepared: set[str] = set()  # the gids this process prepared
        self.first_commit = False  # whether a batch this process wrote is visible yet
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
            copy_rows(cur, sql.Identifier("stage_lines"), lines)
            upsert_lines(cur, sql.Identifier("stage_lines"), lines.column_names)
            copy_rows(cur, sql.Identifier("stage_revenue"), delta)
            add_revenue(cur, sql.SQL("SELECT * FROM stage_revenue"))
        self.visible = max(self.visible, batch_id)
        self._committed()

    def _committed(self) -> None:
        """A batch this process wrote is visible: the first one is a step of its start."""
        if not self.first_commit:
            self.first_commit = True
            self.events.write("first_commit")

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
                copy_rows(cur, stage, lines)
                upsert_lines(cur, stage, lines.column_names)
                # Only this transaction's rows are visible to it: the staged rows of
                # other prepared batches are uncommitted (and deleted) already.
                cur.execute(sql.SQL("DELETE FROM {}").format(stage))
                deltas = sql.SQL("public.bench_2pc_revenue_delta")
                copy_rows(cur, deltas, delta.append_column("gid", pa.array([gid] * delta.num_rows)))
                if self.revenue == "upsert":
                    # Into the totals now: their rows stay locked until COMMIT PREPARED.
                    add_revenue(cur, sql.SQL(
                        "SELECT o_custkey, revenue, lines, _epoch FROM {} WHERE gid = {}"
                    ).format(deltas, sql.Literal(gid)))  # fmt: skip
                    cur.execute(sql.SQL("DELETE FROM {} WHERE gid = %s").format(deltas), (gid,))
                cur.execute(
                    "INSERT INTO public.bench_2pc_batches (gid, batch_id) VALUES (%s, %s)",
                    (gid, batch_id),
                )
                cur.execute(sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(gid)))
                self.prepared.add(gid)
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
                if gid in self.prepared:
                    self._committed()
                hooks.point(CHECKPOINT_COMMITTED)
            with self.commits.transaction():
                cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                pending = cur.execute(
                    "SELECT count(*) FROM public.bench_2pc_revenue_delta"
                ).fetchone()
                if pending and pending[0]:
                    add_revenue(cur, sql.SQL(
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

    events = EventLog(args.workdir / "events.jsonl")
    events.write("process")
    batches = Batches(dsn, args.mode, args.revenue, events)
    checkpointer: Checkpointer | None = None
    if args.mode == "two_phase":
        # A restart first completes what the last run prepared (complete batches),
        # before Spark starts, as the pull-and-diff pipeline recovers while it starts.
        settled = batches.checkpoint()
        events.write("settled", batches=len(settled))
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
    events.write("spark_up")
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
        events.write("started")
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
