"""A Structured Streaming pipeline from a Kafka topic into PostgreSQL and a Kafka topic.

``python -m tests.kafka_stream_pipeline BOOTSTRAP IN_TOPIC OUT_TOPIC DSN ROOT RUN_TAG``

It reads ``IN_TOPIC`` through Spark's Kafka connector, ``ROWS`` offsets per
micro-batch (``maxOffsetsPerTrigger``), until it has read everything
(``availableNow``); each record's value is a JSON object ``{"id", "customer",
"amount"}``. Through ``reconcile.spark.write_stream``, with an expected state
under ``ROOT/store``, every micro-batch goes to two sinks:

- ``events``, a PostgreSQL table (key ``id``), stamped with RUN_TAG;
- ``out``, the compacted topic OUT_TOPIC (key ``id``), through the Kafka sink.

Tests kill it with ``RECONCILE_KILL_AT`` (and ``RECONCILE_KILL_ONCE``) and run
it again on the same ROOT, which resumes from the same Spark checkpoint. It
prints one JSON line: the epochs committed and replayed.
"""

from __future__ import annotations

import json
import os
import sys

ROWS = 6
TABLES = """
CREATE TABLE IF NOT EXISTS events (
    id bigint PRIMARY KEY, customer int NOT NULL, amount numeric(12,2), run text, _epoch bigint
);
"""
VALUE = "id long, customer int, amount decimal(12,2)"


def main(argv: list[str]) -> int:
    bootstrap, in_topic, out_topic, dsn, root, run_tag = argv[:6]
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    import psycopg
    from pyspark.sql import functions as F

    from reconcile import CommitCycle
    from reconcile.engine.expected import ExpectedState
    from reconcile.spark.stream import write_stream
    from sinks.kafka.sink import KafkaSink
    from sinks.postgres.factory import postgres_sink
    from tests.fix_spark import build_local_session

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(TABLES)  # type: ignore[arg-type]

    def build() -> CommitCycle:
        expected = ExpectedState(f"{root}/store", "shop", {"events": ["id"], "out": ["id"]})
        sinks = [
            postgres_sink(dsn, "events", name="events"),
            KafkaSink(bootstrap, out_topic, name="out", key=["id"],
                      marker_topic=f"{out_topic}-markers", transactional_prefix=out_topic),
        ]  # fmt: skip
        return CommitCycle("shop", sinks, expected_state=expected)

    spark = build_local_session("reconcile-kafka-test", **{"spark.sql.shuffle.partitions": "2"})
    spark.sparkContext.setLogLevel("ERROR")
    frame = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", in_topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", ROWS)
        .load()
        .select(F.from_json(F.col("value").cast("string"), VALUE).alias("v"))
        .select("v.*")
        .withColumn("run", F.lit(run_tag))
    )
    query = write_stream(
        frame,
        build,
        checkpoint=f"{root}/checkpoint",
        staging=f"{root}/staging",
        outputs={"events": lambda b: b, "out": lambda b: b.drop("run")},
        trigger={"availableNow": True},
        via="driver",
    )
    query.awaitTermination()
    writer = query.reconcile_writer
    report = writer.report
    writer.close()
    replayed = [r.epoch for r in report.results if getattr(r, "replayed", False)]
    print(json.dumps({"committed": report.committed_epochs, "replayed": replayed}), flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
