"""Kafka into Spark into PostgreSQL and Kafka, exactly once, with the driver killed mid-batch.

The input is a real topic on a real broker, read by Spark's Kafka connector;
the outputs are a PostgreSQL table and a compacted topic written by the Kafka
sink. After a SIGKILL of the driver at a named point and a restart from the
same checkpoint, every input record is in PostgreSQL once (checked with SQL)
and in the output topic once (checked with a ``read_committed`` consumer), and
every epoch's offset ranges are in the store.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka import Producer

from expected_state.source_offsets import OffsetRange, SourceOffsets
from reconcile.testing.kafka_broker import KafkaBroker
from sinks.kafka.records import decode_key, decode_value
from tests.fix_kafka import create_topic, read_topic
from tests.kafka_stream_pipeline import ROWS

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
RECORDS = 3 * ROWS  # three micro-batches
KILLS = ["stream.batch_staged", "cycle.decided", "stream.batch_committed"]


def amount(i: int) -> Decimal:
    return Decimal(i * 7 % 1000) / 100


def produce_input(broker: KafkaBroker, topic: str) -> None:
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(RECORDS):
        value = {"id": i, "customer": i % 4, "amount": float(amount(i))}
        producer.produce(topic, key=str(i).encode(), value=json.dumps(value).encode())
    assert producer.flush(30) == 0


def run(
    broker: KafkaBroker, topics: tuple[str, str], dsn: str, root: Path, tag: str,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:  # fmt: skip
    return subprocess.run(
        [sys.executable, "-m", "tests.kafka_stream_pipeline", broker.bootstrap, *topics, dsn,
         str(root), tag],
        cwd=REPO,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable, "PYTHONPATH": str(REPO),
             **(env or {})},
        capture_output=True,
        text=True,
        timeout=600,
    )  # fmt: skip


def check_exactly_once(broker: KafkaBroker, out_topic: str, dsn: str) -> None:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT id, customer, amount, _epoch FROM events").fetchall()
    assert sorted(r[0] for r in rows) == list(range(RECORDS))  # none lost, none twice
    assert {(i, c, a) for i, c, a, _ in rows} == {(i, i % 4, amount(i)) for i in range(RECORDS)}
    assert all(e == i // ROWS for i, _, _, e in rows)  # each row under its own epoch
    records = read_topic(broker, out_topic)  # read_committed
    keys = [decode_key(k or b"", ["id"])["id"] for k, _, _ in records]
    assert sorted(keys) == list(range(RECORDS))  # each output record exactly once
    values: dict[int, Any] = {
        decode_key(k or b"", ["id"])["id"]: decode_value(v or b"{}") for k, v, _ in records
    }
    assert all(values[i]["customer"] == i % 4 for i in range(RECORDS))


def check_offsets(root: Path, in_topic: str) -> None:
    ranges = SourceOffsets(str(root / "store"), "shop").ranges(through=10)
    assert sorted(ranges) == [0, 1, 2]
    covered = sorted((r.from_offset, r.to_offset) for e in ranges.values() for r in e)
    assert covered == [(0, ROWS), (ROWS, 2 * ROWS), (2 * ROWS, 3 * ROWS)]
    assert ranges[1] == [OffsetRange(in_topic, 0, ROWS, 2 * ROWS)]


@pytest.mark.spark  # in a subprocess
@pytest.mark.chaos
@pytest.mark.parametrize("point", KILLS)
def test_kafka_to_postgres_and_kafka_exactly_once_with_the_driver_killed(
    kafka_broker: KafkaBroker, pg_db: str, tmp_path: Path, point: str
) -> None:
    in_topic = create_topic(kafka_broker, "in")
    out_topic = create_topic(kafka_broker, "out", **{"cleanup.policy": "compact"})
    produce_input(kafka_broker, in_topic)
    fired = tmp_path / "killed"
    env = {"RECONCILE_KILL_AT": f"{point}:2", "RECONCILE_KILL_ONCE": str(fired)}
    killed = run(kafka_broker, (in_topic, out_topic), pg_db, tmp_path, "r1", env)
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert fired.read_text().split()[1] == point  # the fault fired, there
    resumed = run(kafka_broker, (in_topic, out_topic), pg_db, tmp_path, "r2")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    check_exactly_once(kafka_broker, out_topic, pg_db)
    check_offsets(tmp_path, in_topic)
