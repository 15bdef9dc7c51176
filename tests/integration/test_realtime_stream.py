"""Kafka into PostgreSQL under Real-Time Mode, exactly once, with the driver killed mid-batch.

A real topic on a real broker, read by Spark's Kafka connector under
``trigger(realTime=...)``, written by ``reconcile.spark.realtime``'s ``foreach``
writer (the Python one, and the JVM one compiled from source) in small
transactions. The driver is killed with SIGKILL once some rows of the first long
batch are in PostgreSQL (so the batch's offsets are not in Spark's checkpoint
and it runs again from its start); after a restart from the
same checkpoint every record is in the table once, checked with SQL.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka import Producer

from reconcile.core.contract import ConfigurationError
from reconcile.testing.kafka_broker import KafkaBroker
from tests.fix_kafka import create_topic

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
PARTITIONS = 2
FIRST = 200  # produced before the first run: 100 per partition
RECORDS = 300  # and 100 more before the restart


def command(
    broker: KafkaBroker, topic: str, dsn: str, root: Path, writer: Sequence[str] = ("python",)
) -> list[str]:
    """The pipeline's command line; ``writer`` is ``python``, or ``jvm`` and the writer's JAR."""
    return [sys.executable, "-m", "tests.realtime_pipeline", broker.bootstrap, topic, dsn,
            str(root), str(RECORDS), *writer]  # fmt: skip


ENV = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYTHONPATH": str(REPO)}


def produce(broker: KafkaBroker, topic: str, values: range) -> None:
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    for i in values:
        producer.produce(topic, value=f"v{i}".encode(), partition=i % PARTITIONS)
    assert producer.flush(30) == 0


def generations(dsn: str, topic: str) -> dict[int, int]:
    """Each partition's writer generation in the offset markers."""
    with psycopg.connect(dsn) as conn:
        found = conn.execute(
            "SELECT kafka_partition, generation FROM reconcile.reconcile_realtime_offsets "
            "WHERE topic = %s",
            (topic,),
        ).fetchall()
    return {int(p): int(g) for p, g in found}


def count(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        exists = conn.execute("SELECT to_regclass('public.events')").fetchone()
        if exists is None or exists[0] is None:
            return 0
        row = conn.execute("SELECT count(*) FROM events").fetchone()
    return int(row[0]) if row else 0


def kill_inside_the_first_batch(
    broker: KafkaBroker, topic: str, dsn: str, driver_command: list[str]
) -> None:
    """Produce the first records, start the driver, SIGKILL it once rows are visible."""
    produce(broker, topic, range(FIRST))
    driver = subprocess.Popen(driver_command, cwd=REPO, env=ENV, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)  # fmt: skip
    deadline = time.monotonic() + 240
    while count(dsn) == 0 and driver.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert driver.poll() is None, driver.communicate()[1][-3000:]  # still inside batch 0
    driver.send_signal(signal.SIGKILL)
    _, err = driver.communicate(timeout=60)
    assert driver.returncode == -9, err[-3000:]  # the fault fired


def kafka_frame(spark: object, broker: KafkaBroker) -> object:
    """A streaming frame of a fresh topic, through Spark's Kafka source."""
    return (
        spark.readStream.format("kafka")  # type: ignore[attr-defined]
        .option("kafka.bootstrap.servers", broker.bootstrap)
        .option("subscribe", create_topic(broker, "rt"))
        .load()
    )


@pytest.mark.slow
@pytest.mark.spark  # in a subprocess
@pytest.mark.chaos
@pytest.mark.timeout(900)  # two driver starts and a 30-second batch, on a loaded machine
@pytest.mark.parametrize("kind", ["python", "jvm"])
def test_realtime_mode_into_postgres_exactly_once_with_the_driver_killed_mid_batch(
    kind: str,
    kafka_broker: KafkaBroker,
    pg_db: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    writer = [kind]
    if kind == "jvm":
        writer.append(str(request.getfixturevalue("realtime_writer_jar")))
    topic = create_topic(kafka_broker, "rt", PARTITIONS)
    kill_inside_the_first_batch(kafka_broker, topic, pg_db, command(
        kafka_broker, topic, pg_db, tmp_path, writer))  # fmt: skip
    # Batch 0 was running: it never reached the commit log (Real-Time Mode writes a
    # batch's offset log entry only at its end, when its end offsets are known), so
    # the restart runs it again from its start offsets: a replay of what was committed.
    assert (tmp_path / "checkpoint" / "sources" / "0" / "0").exists()
    assert not (tmp_path / "checkpoint" / "commits" / "0").exists()
    time.sleep(2)  # the killed driver's JVM and Python workers see their pipes close
    assert 0 < count(pg_db) <= FIRST
    claimed = generations(pg_db, topic)  # the partitions the killed run wrote
    assert claimed
    produce(kafka_broker, topic, range(FIRST, RECORDS))
    resumed = subprocess.run(
        command(kafka_broker, topic, pg_db, tmp_path, writer), cwd=REPO, env=ENV,
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    with psycopg.connect(pg_db) as conn:
        rows = conn.execute("SELECT k, part, off FROM events").fetchall()
    assert len(rows) == RECORDS  # none twice
    assert sorted((k, p, o) for k, p, o in rows) == sorted(
        (f"v{i}", i % PARTITIONS, i // PARTITIONS) for i in range(RECORDS)
    )  # none missing, each from its own offset
    # The restarted driver's tasks claimed anew the partitions the killed run had written.
    after = generations(pg_db, topic)
    assert sorted(after) == list(range(PARTITIONS))
    assert all(after[p] > g for p, g in claimed.items())


@pytest.mark.spark
def test_a_stateful_plan_is_refused_by_name(spark: object, kafka_broker: KafkaBroker) -> None:
    from reconcile.spark.realtime import check_realtime_plan

    frame: Any = kafka_frame(spark, kafka_broker)
    counted = frame.groupBy("topic", "partition").count()
    with pytest.raises(ConfigurationError, match="the plan has Aggregate"):
        check_realtime_plan(counted, ())
    with pytest.raises(ConfigurationError, match="no column k"):
        check_realtime_plan(frame, ("k",))
    check_realtime_plan(frame.selectExpr("CAST(value AS STRING) AS k", "*"), ("k",))


@pytest.mark.spark
def test_a_plan_that_makes_several_rows_of_one_record_is_refused_by_name(
    spark: object, kafka_broker: KafkaBroker
) -> None:
    from reconcile.spark.realtime import check_realtime_plan

    frame: Any = kafka_frame(spark, kafka_broker)
    columns = ("topic", "partition", "offset", "k")
    exploded = frame.selectExpr("explode(array(value, key)) AS k", "topic", "partition", "offset")
    with pytest.raises(ConfigurationError, match="the plan has Generate, which may make several"):
        check_realtime_plan(exploded, ("k",))

    def batches(parts: object) -> object:
        yield from parts  # type: ignore[attr-defined]

    mapped = frame.selectExpr("CAST(value AS STRING) AS k", "topic", "partition", "offset")
    in_arrow = mapped.mapInArrow(batches, mapped.schema)
    with pytest.raises(ConfigurationError, match="the plan has MapInArrow"):
        check_realtime_plan(in_arrow, columns[3:])
