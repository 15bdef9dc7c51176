"""The Kafka benchmark's Spark driver: runs, each a topic into a PostgreSQL table, in a write mode.

``python -m benchmarks.kafka.pipeline [--master M]``, with its plan in
``BENCH_PLAN``: a JSON list of runs, each ``{mode, bootstrap, topic, workdir,
dsn, rows, trigger, max_offsets}`` (in the environment: the DSNs stay off the
command line, where ``ps`` shows them). The runs go one after another in one
Spark session.

A run reads its topic through Spark's Kafka connector (``startingOffsets``
earliest, at most ``max_offsets`` per micro-batch) and writes every record, its
JSON value ``{"id", "customer", "amount"}`` and the record's Kafka timestamp
(``produced``), into ``events``. With ``trigger`` S > 0 the query runs on a
processing-time trigger of S seconds and stops once ``rows`` rows are visible;
with 0 it reads what the topic holds (``availableNow``) and stops.

A run's mode is one of:

- ``exactly_once``: this engine, ``reconcile.spark.write_stream`` into the
  PostgreSQL sink with an expected state under ``WORKDIR/store`` (markers, one
  sink transaction per micro-batch, replay-safe);
- ``at_least_once``: ``foreachBatch`` COPYs the micro-batch into ``events``
  in one transaction and COMMITs; nothing guards a replayed batch.

Both collect a micro-batch to the driver as Arrow (the engine's ``via="driver"``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

__all__ = ["MODES", "TABLE_SQL", "main"]

MODES = ("exactly_once", "at_least_once")
TABLE_SQL = (
    "CREATE TABLE IF NOT EXISTS events (id bigint PRIMARY KEY, customer int NOT NULL, "
    "amount numeric(12,2), produced timestamptz NOT NULL, _epoch bigint)"
)
VALUE = "id long, customer int, amount decimal(12,2)"


class PlainInsert:
    """``foreachBatch``: the batch COPYed into ``events`` in one transaction, then COMMIT."""

    def __init__(self, dsn: str) -> None:
        self.conn = psycopg.connect(dsn)

    def __call__(self, frame: Any, batch_id: int) -> None:
        from benchmarks.latency.sql import copy_rows

        table = frame.toArrow()
        if table.num_rows == 0:
            return
        import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]

        table = table.append_column("_epoch", pa.array([batch_id] * table.num_rows, pa.int64()))
        with self.conn.cursor() as cur:
            copy_rows(cur, sql.Identifier("events"), table)
        self.conn.commit()


def visible(dsn: str) -> int:
    """How many rows ``events`` holds (what a reader sees now)."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT count(*) FROM events").fetchone()
    return int(row[0]) if row else 0


def run_one(spark: Any, run: dict[str, Any]) -> int:
    """Stream ``run``'s topic into its table until its rows are visible; 0, or 1 if short."""
    from pyspark.sql import functions as F

    workdir, dsn = Path(run["workdir"]), run["dsn"]
    frame = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", run["bootstrap"])
        .option("subscribe", run["topic"])
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", run["max_offsets"])
        .load()
        .select(F.from_json(F.col("value").cast("string"), VALUE).alias("v"), "timestamp")
        .select("v.*", F.col("timestamp").alias("produced"))
    )
    trigger: dict[str, Any] = (
        {"processingTime": f"{run['trigger']:g} seconds"}
        if run["trigger"]
        else {"availableNow": True}
    )
    checkpoint = str(workdir / "checkpoint")
    if run["mode"] == "exactly_once":
        query = _engine_query(frame, workdir, dsn, checkpoint, trigger)
    else:
        plain = PlainInsert(dsn)
        query = (
            frame.writeStream.foreachBatch(plain)
            .option("checkpointLocation", checkpoint)
            .trigger(**trigger)
            .start()
        )
    try:
        # A processing-time query never ends by itself: it stops once every row is in.
        while query.isActive and visible(dsn) < run["rows"]:
            query.awaitTermination(0.2)
        if query.exception() is not None:
            raise RuntimeError(f"the streaming query failed: {query.exception()}")
    finally:
        query.stop()
        writer = getattr(query, "reconcile_writer", None)
        if writer is not None:
            writer.close()
        else:
            plain.conn.close()
    got = visible(dsn)
    if got != run["rows"]:
        print(f"{run['mode']}: {got} rows visible, {run['rows']} expected", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.kafka.pipeline")
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args(argv)
    plan = json.loads(os.environ["BENCH_PLAN"])
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from reconcile.spark.session import local_session

    spark = local_session(
        "bench-kafka",
        args.master,
        **{"spark.sql.shuffle.partitions": "2", "spark.sql.adaptive.enabled": "false"},
    )
    spark.sparkContext.setLogLevel("ERROR")
    status = 0
    for run in plan:  # one after another: the parent feeds and reads them in this order
        status |= run_one(spark, run)
    spark.stop()
    return status


def _engine_query(
    frame: Any, workdir: Path, dsn: str, checkpoint: str, trigger: dict[str, Any]
) -> Any:
    """The engine's exactly-once streaming writer into the PostgreSQL sink."""
    from reconcile import CommitCycle
    from reconcile.engine.expected import ExpectedState
    from reconcile.spark.stream import write_stream
    from sinks.postgres.factory import postgres_sink

    def build() -> CommitCycle:
        expected = ExpectedState(str(workdir / "store"), "bench", {"events": ["id"]})
        return CommitCycle("bench", [postgres_sink(dsn, "events", name="events")],
                           expected_state=expected)  # fmt: skip

    return write_stream(
        frame,
        build,
        checkpoint=checkpoint,
        staging=str(workdir / "staging"),
        outputs={"events": lambda b: b},
        trigger=trigger,
        via="driver",
    )


if __name__ == "__main__":
    sys.exit(main())
