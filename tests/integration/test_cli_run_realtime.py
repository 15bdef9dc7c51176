"""``reconcile run`` under Real-Time Mode: a main killed, the standby takes over, each record once.

A real topic on a real broker, the pipeline's run table with ``realtime``: the
main and a ``--standby`` are real processes, each with its own Spark. The main
is SIGKILLed (its whole process group: driver, JVM, workers) once rows of it
are in PostgreSQL; the standby takes the lease once it runs out and streams the
rest from the shared checkpoint, its tasks claiming the partitions' markers
anew. SIGTERM stops it with exit 0 and the lease released. Every Kafka record
is then in the table once, from its own offset, checked with SQL.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Producer

from reconcile.testing.kafka_broker import KafkaBroker
from tests.fix_kafka import create_topic
from tests.integration.test_cli_config import password_dsn
from tests.integration.test_cli_run import Popen, holder_pid, query, started, wait_for

__all__ = ["started"]  # the fixture, imported for pytest

pytestmark = [pytest.mark.integration]

PARTITIONS = 2
FIRST, RECORDS = 200, 300

APP = '''
"""The test's app: a Kafka topic, each record's value and place."""


def events(spark, pipeline):
    return (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", {bootstrap!r})
        .option("subscribe", {topic!r})
        .option("startingOffsets", "earliest")
        .load()
        .selectExpr("CAST(value AS STRING) AS k", "topic", "partition", "offset",
                    "partition AS part", "offset AS off")
    )
'''

CONFIG = """
[store]
root = "expected"

[pipelines.orders.sinks.events]
dsn = "{dsn}"
password_env = "RUN_PG_PASSWORD"
table = "rt.events"
keys = ["part", "off"]

[pipelines.orders.run]
app = "rt_test_app:events"
checkpoint = "state/checkpoint"
realtime = "10 seconds"
rows_per_txn = 5
ms_per_txn = 50
lease_term_s = 2
master = "local[2]"
"""


def produce(broker: KafkaBroker, topic: str, values: range) -> None:
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    for i in values:
        producer.produce(topic, value=f"v{i}".encode(), partition=i % PARTITIONS)
    assert producer.flush(30) == 0


def rows(dsn: str) -> int:
    return int(query(dsn, "SELECT count(*) FROM rt.events")[0][0])


@pytest.mark.slow  # two Spark drivers and a takeover: drawn in CI (tests/heavy_groups.py)
@pytest.mark.timeout(900)  # two `reconcile run` processes, each with its own Spark
@pytest.mark.spark  # in a subprocess
def test_a_realtime_run_killed_is_taken_over_by_its_standby_and_each_record_lands_once(
    kafka_broker: KafkaBroker, pg_db: str, tmp_path: Path, started: Callable[..., Popen]
) -> None:
    query(pg_db, "CREATE SCHEMA rt")
    query(pg_db, "CREATE TABLE rt.events (k text NOT NULL, part int, off bigint)")
    topic = create_topic(kafka_broker, "rtrun", PARTITIONS)
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "rt_test_app.py").write_text(
        APP.format(bootstrap=kafka_broker.bootstrap, topic=topic)
    )
    (tmp_path / "reconcile.toml").write_text(CONFIG.format(dsn=password_dsn(pg_db)))
    produce(kafka_broker, topic, range(FIRST))
    deadline = time.monotonic() + 420
    main = started(log="main.log")
    wait_for("the main's lease", lambda: holder_pid(pg_db) is not None, deadline, main)
    held = holder_pid(pg_db)
    assert held is not None and held[0] == main.pid
    standby = started("--standby", log="standby.log")
    wait_for("the main's first rows", lambda: rows(pg_db) > 0, deadline, main, standby)
    os.killpg(main.pid, signal.SIGKILL)
    assert main.wait(timeout=60) == -signal.SIGKILL  # the fault fired
    before = rows(pg_db)
    produce(kafka_broker, topic, range(FIRST, RECORDS))
    wait_for("the standby's lease", lambda: (holder_pid(pg_db) or (0, 0))[0] == standby.pid,
             deadline, standby)  # fmt: skip
    wait_for("every record", lambda: rows(pg_db) >= RECORDS, deadline, standby)
    time.sleep(3)  # a replayed record written twice would show up by now
    standby.send_signal(signal.SIGTERM)
    assert standby.wait(timeout=120) == 0, (tmp_path / "standby.log").read_text()[-3000:]
    standby_log = (tmp_path / "standby.log").read_text()
    assert "stopped by SIGTERM" in standby_log, standby_log[-3000:]
    assert holder_pid(pg_db) is None  # released at once, not left to run out
    found = query(pg_db, "SELECT k, part, off FROM rt.events")
    assert len(found) == RECORDS, (before, len(found))  # none twice
    assert sorted(found) == sorted(
        (f"v{i}", i % PARTITIONS, i // PARTITIONS) for i in range(RECORDS)
    )  # none missing, each from its own offset
    markers = query(
        pg_db,
        "SELECT kafka_partition, last_offset FROM reconcile.reconcile_realtime_offsets "
        f"WHERE pipeline = 'orders' AND sink = 'events' AND topic = '{topic}' ORDER BY 1",
    )
    assert markers == [(p, RECORDS // PARTITIONS - 1) for p in range(PARTITIONS)]
