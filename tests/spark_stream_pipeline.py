"""A Structured Streaming pipeline into PostgreSQL, run in a subprocess by the stream tests.

``python -m tests.spark_stream_pipeline DSN ROOT RUN_TAG [MASTER [FORM]]``

It reads the JSON files in ``ROOT/inbox`` one per micro-batch (so batch b is
file b) and writes two sink tables through ``reconcile.spark.write_stream``
with an expected state under ``ROOT/store``:

- ``events`` (key ``id``): the batch's rows, stamped with RUN_TAG in ``run``,
  which makes the transform non-deterministic on replay: a re-run of a batch
  by a restarted process writes other values than the killed run did;
- ``totals`` (key ``customer``): the batch's sum and count per customer.

FORM ``write_stream`` (the default) lets the executors write both sinks
(staging tables and store change files, split by key into two tasks,
``via="executors"``); ``driver`` passes ``via="driver"``, so the rows go
through files the driver reads; ``auto`` passes ``via="auto"``, so these
small batches are collected to the driver by Spark's Arrow collect. With
``format``, the stream goes through ``df.writeStream.format("reconcile")``
instead, into ``events`` alone (whose commit runs in a Python process Spark
starts, which builds its cycle with :func:`build_events`).

It stops when every file is processed (``availableNow``). Tests kill it with
``RECONCILE_KILL_AT`` (and ``RECONCILE_KILL_ONCE``) and run it again on the
same ROOT, which resumes from the same Spark checkpoint.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

TABLES = """
CREATE TABLE IF NOT EXISTS events (
    id bigint PRIMARY KEY, customer int NOT NULL, amount numeric(12,2), run text, _epoch bigint
);
CREATE TABLE IF NOT EXISTS totals (
    customer int PRIMARY KEY, amount numeric(14,2), n bigint, _epoch bigint
);
"""
SCHEMA = "id long, customer int, amount decimal(12,2)"


def outputs(run_tag: str) -> dict[str, Any]:
    """Each sink's DataFrame from a micro-batch (``events`` stamped with the run's tag)."""
    from pyspark.sql import functions as F

    return {
        "events": lambda b: b.withColumn("run", F.lit(run_tag)),
        "totals": lambda b: b.groupBy("customer").agg(
            F.sum("amount").cast("decimal(14,2)").alias("amount"), F.count("*").alias("n")
        ),
    }


def build_events(options: dict[str, str]) -> Any:
    """The ``build`` option of the format writer: the cycle of ``events`` alone."""
    from reconcile import CommitCycle
    from reconcile.engine.expected import ExpectedState
    from sinks.postgres.factory import postgres_sink

    expected = ExpectedState(f"{options['root']}/store", "shop", {"events": ["id"]})
    sink = postgres_sink(options["dsn"], "events", name="events")
    return CommitCycle("shop", [sink], expected_state=expected)


def main(argv: list[str]) -> int:
    dsn, root, run_tag = argv[0], argv[1], argv[2]
    master = argv[3] if len(argv) > 3 else "local[2]"
    form = argv[4] if len(argv) > 4 else "write_stream"
    use_format = form == "format"
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    import psycopg

    from reconcile import CommitCycle
    from reconcile.engine.expected import ExpectedState
    from reconcile.spark.stream import write_stream
    from sinks.postgres.factory import postgres_sink
    from tests.fix_spark import build_local_session

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(TABLES)  # type: ignore[arg-type]

    def build() -> CommitCycle:
        expected = ExpectedState(
            f"{root}/store", "shop", {"events": ["id"], "totals": ["customer"]}
        )
        sinks = [postgres_sink(dsn, t, name=t) for t in ("events", "totals")]
        return CommitCycle("shop", sinks, expected_state=expected)

    spark = build_local_session(
        "reconcile-stream-test",
        master,
        **{
            "spark.sql.shuffle.partitions": "2",
            # Two tasks per sink even for these few rows: several store parts.
            "spark.sql.adaptive.coalescePartitions.enabled": "false",
        },
    )
    spark.sparkContext.setLogLevel("ERROR")
    frame = (
        spark.readStream.schema(SCHEMA)
        .option("maxFilesPerTrigger", 1)
        .json(f"{root}/inbox")
        .repartition(2)  # two tasks per batch: two staged files per sink
    )
    if use_format:
        from pyspark.sql import functions as F

        from reconcile.spark.source import register

        register(spark)
        query = (
            frame.withColumn("run", F.lit(run_tag))
            .writeStream.format("reconcile")
            .option("build", "tests.spark_stream_pipeline:build_events")
            .option("staging", f"{root}/staging")
            .option("dsn", dsn)
            .option("root", root)
            .option("checkpointLocation", f"{root}/checkpoint")
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        print(json.dumps({"committed": None}), flush=True)
        spark.stop()
        return 0
    query = write_stream(
        frame,
        build,
        checkpoint=f"{root}/checkpoint",
        staging=f"{root}/staging",
        outputs=outputs(run_tag),
        trigger={"availableNow": True},
        via=form if form in ("driver", "auto") else "executors",
    )
    query.awaitTermination()
    writer = query.reconcile_writer
    report = writer.report
    writer.close()
    print(
        json.dumps(
            {
                "committed": report.committed_epochs,
                "replayed": [r.epoch for r in report.results if getattr(r, "replayed", False)],
                "restarts": report.restarts,
                # The writer's own timing of each batch: (batch, stage ms, commit ms).
                "timed": [(b.batch_id, b.stage_ms, b.commit_ms) for b in writer.history],
                # Which way each sink's rows took, batch by batch.
                "via": [b.via for b in writer.history],
            }
        ),
        flush=True,
    )
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
