"""The Real-Time Mode benchmark's Spark driver: one mode's query, a Kafka topic into PostgreSQL.

``python -m benchmarks.realtime.driver``, with its run in ``BENCH_PLAN`` (JSON, in the
environment: the DSN stays off the command line, where ``ps`` shows it): ``{mode, kind,
bootstrap, topic, dsn, workdir, jar, rtm_batch, rows_per_txn, ms_per_txn, trigger_s,
checkpoint_s}``. The query runs until the parent creates ``WORKDIR/stop`` (it does once
every record is visible, or it gave up waiting); the driver then stops it and exits 0, or
1 if the query failed.

A run's ``kind`` (the parent's modes, ``benchmarks.realtime.bench``):

- ``rtm_at_least_once``: Real-Time Mode, ``benchmarks/realtime_jvm/InsertWriter.java``,
  a JVM ``foreach`` writer inserting in transactions of ``rows_per_txn`` rows or
  ``ms_per_txn`` ms, as the exactly-once writer, without markers (``rows_per_txn`` 1:
  each row in autocommit);
- ``rtm_exactly_once``: Real-Time Mode, ``reconcile.spark.realtime.start_realtime``
  with ``writer="jvm"`` (offset markers, small transactions);
- ``microbatch``: this engine's micro-batch writer (``write_stream``, pull-and-diff),
  exactly as ``benchmarks.kafka``'s ``exactly_once`` mode, at a processing-time trigger;
- ``two_phase``: ``foreachBatch`` COPYs each micro-batch and PREPAREs it; a checkpoint
  thread (``benchmarks.latency.modes.Checkpointer``) COMMIT PREPAREDs every
  ``checkpoint_s`` seconds.

The Real-Time Mode runs write ``events (id, part, off, produced)`` without a key, so a
replayed row would show as a duplicate; the micro-batch runs write ``benchmarks.kafka``'s
``events`` table (key ``id``).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import psycopg
from psycopg import sql

from benchmarks.kafka.pipeline import VALUE, PlainInsert, _engine_query
from benchmarks.latency.modes import Checkpointer

if TYPE_CHECKING:
    from benchmarks.latency.modes import Batches

__all__ = ["KINDS", "RTM_TABLE_SQL", "TwoPhase", "main"]

KINDS = ("rtm_at_least_once", "rtm_exactly_once", "microbatch", "two_phase")
RTM_TABLE_SQL = (
    "CREATE TABLE IF NOT EXISTS events (id bigint NOT NULL, part int NOT NULL, "
    "off bigint NOT NULL, produced timestamptz NOT NULL)"
)


class TwoPhase(PlainInsert):
    """``foreachBatch``: COPY the batch into ``events`` and PREPARE; a checkpoint commits.

    A replayed batch whose gid is prepared already is skipped. The checkpoint
    (:meth:`checkpoint`) COMMIT PREPAREDs every prepared batch of this database.
    """

    def __init__(self, dsn: str) -> None:
        super().__init__(dsn)
        self.conn.autocommit = True
        self.dbname = str(self.conn.info.dbname)
        self.commits = psycopg.connect(dsn, autocommit=True)

    def gid(self, batch_id: int) -> str:
        return f"rtbench_{self.dbname}_{batch_id}"

    def __call__(self, frame: Any, batch_id: int) -> None:
        from benchmarks.latency.sql import copy_rows

        table = frame.toArrow()
        if table.num_rows == 0:
            return
        import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]

        table = table.append_column("_epoch", pa.array([batch_id] * table.num_rows, pa.int64()))
        gid = self.gid(batch_id)
        with self.conn.cursor() as cur:
            seen = cur.execute("SELECT 1 FROM pg_prepared_xacts WHERE gid = %s", (gid,)).fetchone()
            if seen:
                return
            cur.execute("BEGIN")
            try:
                copy_rows(cur, sql.Identifier("events"), table)
                cur.execute(sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(gid)))
            except BaseException:
                cur.execute("ROLLBACK")
                raise

    def checkpoint(self) -> list[int]:
        """COMMIT PREPARED every prepared batch of this database; their batch ids."""
        done: list[int] = []
        with self.commits.cursor() as cur:
            gids = cur.execute(
                "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() "
                "AND gid LIKE 'rtbench\\_%' ORDER BY prepared"
            ).fetchall()
            for (gid,) in gids:
                cur.execute(sql.SQL("COMMIT PREPARED {}").format(sql.Literal(gid)))
                done.append(int(gid.rsplit("_", 1)[1]))
        return done


def kafka_frame(spark: Any, run: dict[str, Any]) -> Any:
    """The topic's records: Real-Time Mode's placing columns, or the JSON value's fields."""
    from pyspark.sql import functions as F

    frame = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", run["bootstrap"])
        .option("subscribe", run["topic"])
        .option("startingOffsets", "earliest")
        .load()
    )
    if run["kind"].startswith("rtm_"):
        return frame.selectExpr(
            "topic",
            "partition",
            "offset",
            "CAST(get_json_object(CAST(value AS STRING), '$.id') AS BIGINT) AS id",
            "partition AS part",
            "offset AS off",
            "timestamp AS produced",
        )
    return frame.select(
        F.from_json(F.col("value").cast("string"), VALUE).alias("v"), "timestamp"
    ).select("v.*", F.col("timestamp").alias("produced"))


def start(spark: Any, run: dict[str, Any]) -> tuple[Any, Any]:
    """Start ``run``'s query; it and what must be closed after it (or None)."""
    from pyspark.sql.streaming.query import StreamingQuery

    from reconcile.spark.realtime import start_realtime
    from sinks import registry
    from sinks.base import REALTIME_JDBC
    from sinks.realtime import RealtimeTarget

    workdir, dsn, kind = Path(run["workdir"]), run["dsn"], run["kind"]
    frame = kafka_frame(spark, run)
    checkpoint = str(workdir / "checkpoint")
    if kind == "rtm_exactly_once":
        target = RealtimeTarget(dsn, "events", ("id", "part", "off", "produced"), "bench", "ev")
        query = start_realtime(
            frame,
            target,
            checkpoint=checkpoint,
            batch=run["rtm_batch"],
            rows_per_txn=run["rows_per_txn"],
            ms_per_txn=run["ms_per_txn"],
            writer="jvm",
        )
        return query, None
    if kind == "rtm_at_least_once":
        jvm = spark._jvm
        url, properties = registry.capability(dsn, REALTIME_JDBC)(dsn, "bench at-least-once")
        jquery = (
            frame._jdf.writeStream()
            .outputMode("update")  # the only mode Real-Time Mode takes
            .foreach(
                jvm.bench.InsertWriter(
                    url, properties, "events", run["rows_per_txn"], run["ms_per_txn"]
                )
            )
            .option("checkpointLocation", checkpoint)
            .trigger(jvm.org.apache.spark.sql.streaming.Trigger.RealTime(run["rtm_batch"]))
            .start()
        )
        return StreamingQuery(jquery), None
    trigger = {"processingTime": f"{run['trigger_s']:g} seconds"}
    if kind == "microbatch":
        return _engine_query(frame, workdir, dsn, checkpoint, trigger), None
    batches = TwoPhase(dsn)
    checkpointer = Checkpointer(cast("Batches", batches), run["checkpoint_s"])  # duck-typed
    checkpointer.start()
    query = (
        frame.writeStream.foreachBatch(batches)
        .option("checkpointLocation", checkpoint)
        .trigger(**trigger)
        .start()
    )
    return query, (batches, checkpointer)


def main() -> int:
    run = json.loads(os.environ["BENCH_PLAN"])
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from reconcile.spark.jars import spark_jars
    from reconcile.spark.session import local_session

    conf = {"spark.sql.shuffle.partitions": "2", "spark.sql.adaptive.enabled": "false"}
    if run.get("jar"):
        # spark.jars is read only when the JVM starts: the session's JARs and the writer's.
        conf["spark.jars"] = ",".join([*spark_jars(), run["jar"]])
    spark = local_session(f"bench-realtime-{run['mode']}", "local[2]", **conf)
    spark.sparkContext.setLogLevel("ERROR")
    query, extra = start(spark, run)
    stop = Path(run["workdir"]) / "stop"
    status = 0
    try:
        while query.isActive and not stop.exists():
            query.awaitTermination(0.5)
        if query.exception() is not None:
            print(f"{run['mode']}: the query failed: {query.exception()}", file=sys.stderr)
            status = 1
    finally:
        query.stop()
        writer = getattr(query, "reconcile_writer", None)
        if writer is not None:
            writer.close()
        if extra is not None:
            batches, checkpointer = extra
            checkpointer.stop.set()
            checkpointer.join()
            if checkpointer.error is not None:
                print(f"{run['mode']}: checkpoint failed: {checkpointer.error}", file=sys.stderr)
                status = 1
            batches.checkpoint()  # nothing left prepared when the server stops
            batches.conn.close()
            batches.commits.close()
    spark.stop()
    return status


if __name__ == "__main__":
    sys.exit(main())
