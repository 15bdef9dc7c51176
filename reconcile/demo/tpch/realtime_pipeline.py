"""The realtime demo's pipeline process: the lineitem topic into PostgreSQL under Real-Time Mode.

``python -m reconcile.demo.tpch.realtime_pipeline WORKDIR MASTER``, started by
``reconcile.demo.tpch.realtime`` with the sink's DSN in ``RECONCILE_DEMO_DSN``
and the broker and topic in ``reconcile.demo.tpch.kafka_source.ENV``. It reads
the topic with Spark's Kafka connector, parses each record into a lineitem row
and writes it with ``reconcile.spark.realtime.start_realtime`` (the JVM writer)
into ``demo_lineitem_rt``, checkpointed under WORKDIR. It runs until killed:
the supervisor kills it (SIGKILL, its whole process group) mid-batch and starts
it again on the same checkpoint, and the offset markers make the replay land
each record once.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

__all__ = ["BATCH", "COLUMNS", "PIPELINE", "SINK", "TABLE", "main"]

TABLE = "demo_lineitem_rt"
PIPELINE, SINK = "demo_rt", "lines"
BATCH = "5 seconds"  # Real-Time Mode's shortest long batch by default
ROWS_PER_TXN, MS_PER_TXN = 200, 50


def _columns() -> tuple[str, ...]:
    from reconcile.demo.tpch.data import LINEITEM_COLUMNS

    return tuple(name for name, _, _ in LINEITEM_COLUMNS)


COLUMNS = _columns()


def main(argv: list[str]) -> int:
    workdir, master = Path(argv[0]), argv[1]
    from reconcile.demo.tpch.kafka_source import ENV, lineitem_rows
    from reconcile.spark.realtime import start_realtime
    from reconcile.spark.session import local_session
    from sinks.realtime import RealtimeTarget

    bootstrap, topic, _ = os.environ[ENV].split("|", 2)
    spark = local_session("reconcile-demo-realtime", master)
    spark.sparkContext.setLogLevel("ERROR")
    records = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .load()
    )
    # The offset columns kept: the writer's markers are made of them.
    frame = lineitem_rows(records, keep=("topic", "partition", "offset"))
    target = RealtimeTarget(os.environ["RECONCILE_DEMO_DSN"], TABLE, COLUMNS, PIPELINE, SINK)
    query = start_realtime(
        frame,
        target,
        checkpoint=str(workdir / "checkpoint-realtime"),
        batch=BATCH,
        rows_per_txn=ROWS_PER_TXN,
        ms_per_txn=MS_PER_TXN,
        query_name="demo_realtime",
    )
    print(f"demo realtime pipeline: running (pid {os.getpid()})", flush=True)
    while query.isActive:
        time.sleep(0.5)
    failure = query.exception()
    if failure is not None:
        print(f"demo realtime pipeline: the query failed: {failure}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
