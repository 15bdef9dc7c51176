"""A Real-Time Mode query from a Kafka topic into PostgreSQL, run as a driver a test can kill.

``python -m tests.realtime_pipeline BOOTSTRAP TOPIC DSN ROOT TOTAL WRITER [JAR]``

It reads TOPIC through Spark's Kafka connector under ``trigger(realTime=BATCH)``
and writes each record (``k`` its value, and its topic, partition and offset)
into the table ``events`` through ``reconcile.spark.realtime``'s WRITER
(``python``, or ``jvm`` run from JAR, the writer compiled from source by
``tests/fix_realtime.py``), with the checkpoint under ``ROOT``. It stops once
the offset markers cover TOTAL records and prints one JSON line: the rows in
``events`` then, and how often the query failed and was started again. Tests kill
it with SIGKILL mid-batch and run it again on the same ROOT.

Two environment variables serve the fault tests: ``RT_MASTER`` (default ``local[2]``;
``local[2,4]`` lets Spark retry a failed task) and ``RT_RESTARTS`` (default 0: how many
times a failed query is started again on its checkpoint, as a supervisor would), and
``RT_SECONDS`` (default 300: how long the query may take to cover TOTAL records).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

# Long: a kill soon after the first rows lands inside batch 0, even on a loaded machine.
BATCH = "30 seconds"
TABLE = "CREATE TABLE IF NOT EXISTS events (k text NOT NULL, topic text, part int, off bigint)"


def covered(conn: object, topic: str) -> int:
    """How many records of ``topic`` the markers say are in ``events``."""
    row = conn.execute(  # type: ignore[attr-defined]
        "SELECT coalesce(sum(last_offset + 1), 0) FROM reconcile.reconcile_realtime_offsets "
        "WHERE pipeline = 'rt' AND sink = 'events' AND topic = %s",
        (topic,),
    ).fetchone()
    return int(row[0])


def main(argv: list[str]) -> int:
    bootstrap, topic, dsn, root, total = argv[0], argv[1], argv[2], argv[3], int(argv[4])
    writer = argv[5]
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    import psycopg

    from reconcile.spark.realtime import start_realtime
    from sinks.realtime import RealtimeTarget
    from tests.fix_realtime import session_jars
    from tests.fix_spark import build_local_session

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(TABLE)
    # local[2]: one task slot per source partition (a long batch holds its slot). A small
    # spark.buffer.size: with the default 64 KiB the rows reach the Python writer only at
    # the batch's end, and a kill "mid-batch" would race with the batch's commit.
    conf = {"spark.buffer.size": "256"}
    if writer == "jvm":
        # The writer compiled from this repository's source, not the cached build.
        conf["spark.jars"] = ",".join(session_jars(Path(argv[6])))
    master = os.environ.get("RT_MASTER", "local[2]")
    spark = build_local_session("reconcile-realtime-test", master=master, **conf)
    spark.sparkContext.setLogLevel("ERROR")
    frame = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .load()
        .selectExpr("CAST(value AS STRING) AS k", "topic", "partition", "offset")
        .selectExpr("k", "topic", "partition", "offset", "partition AS part", "offset AS off")
    )
    target = RealtimeTarget(dsn, "events", ("k", "topic", "part", "off"), "rt", "events")

    def start() -> Any:
        return start_realtime(
            frame,
            target,
            checkpoint=f"{root}/checkpoint",
            batch=BATCH,
            rows_per_txn=5,
            ms_per_txn=50,
            writer=writer,
        )

    query, restarts, allowed = start(), 0, int(os.environ.get("RT_RESTARTS", "0"))
    deadline = time.monotonic() + int(os.environ.get("RT_SECONDS", "300"))
    done, rows = 0, None
    while time.monotonic() < deadline:
        try:
            # A connection per look: the server may be restarted under the query.
            with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as conn:
                done = covered(conn, topic)
                rows = conn.execute("SELECT count(*) FROM events").fetchone()
        except psycopg.OperationalError:
            time.sleep(0.2)
            continue
        if done >= total:
            break
        if query.exception() is not None:
            if restarts >= allowed:
                raise RuntimeError(str(query.exception()))
            print(f"query failed, starting it again: {query.exception()}", file=sys.stderr)
            try:
                query = start()
                restarts += 1
            except Exception as err:  # the server may still be down: the next look retries
                print(f"could not start the query again: {err}", file=sys.stderr)
                time.sleep(1)
        time.sleep(0.2)
    query.stop()
    print(json.dumps({"covered": done, "rows": rows[0] if rows else None, "restarts": restarts}),
          flush=True)  # fmt: skip
    spark.stop()
    return 0 if done >= total else 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
