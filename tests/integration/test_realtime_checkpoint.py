"""A Real-Time Mode driver killed while Spark wrote its commit log entry, then restarted.

Spark writes each checkpoint entry to a temporary file (``commits/.0.<uuid>.tmp`` and
its ``.crc``) and renames it into place. A driver killed between the two leaves the
temporary files and no ``commits/0``; Spark 4.2 then refuses to start a query on that
checkpoint (``STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY``). The kill at that instant
cannot be aimed from outside the JVM, so this test kills the driver mid-batch (as
``test_realtime_stream.py`` does) and leaves in its checkpoint the two temporary files
such a kill left there when it happened (their names and content as Spark writes them);
the restart must start, replay the batch, and land every record once, checked with SQL.
"""

from __future__ import annotations

import subprocess
import time
import uuid
from pathlib import Path

import psycopg
import pytest

from reconcile.testing.kafka_broker import KafkaBroker
from tests.fix_kafka import create_topic
from tests.integration.test_realtime_stream import (
    ENV,
    FIRST,
    PARTITIONS,
    RECORDS,
    REPO,
    command,
    kill_inside_the_first_batch,
    produce,
)

pytestmark = pytest.mark.integration


def leave_an_interrupted_commit(checkpoint: Path) -> list[Path]:
    """The files a driver killed inside its commit log write of batch 0 leaves."""
    commits = checkpoint / "commits"
    commits.mkdir(exist_ok=True)
    name = f".0.{uuid.uuid4()}.tmp"
    entry = commits / name
    entry.write_text('v1\n{"nextBatchWatermarkMs":0}')
    crc = commits / f".{name}.crc"
    crc.write_bytes(b"crc\x00\x00\x00\x00\x00")
    return [entry, crc]


@pytest.mark.slow
@pytest.mark.spark  # in a subprocess
@pytest.mark.chaos
def test_a_restart_after_an_interrupted_commit_log_write_lands_every_record_once(
    kafka_broker: KafkaBroker, pg_db: str, tmp_path: Path
) -> None:
    topic = create_topic(kafka_broker, "rtcp", PARTITIONS)
    kill_inside_the_first_batch(kafka_broker, topic, pg_db, command(
        kafka_broker, topic, pg_db, tmp_path))  # fmt: skip
    checkpoint = tmp_path / "checkpoint"
    assert not (checkpoint / "commits" / "0").exists()
    left = leave_an_interrupted_commit(checkpoint)
    time.sleep(2)  # the killed driver's JVM and Python workers see their pipes close
    produce(kafka_broker, topic, range(FIRST, RECORDS))
    resumed = subprocess.run(
        command(kafka_broker, topic, pg_db, tmp_path), cwd=REPO, env=ENV,
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert not any(path.exists() for path in left)  # the interrupted write was cleared
    with psycopg.connect(pg_db) as conn:
        rows = conn.execute("SELECT k, part, off FROM events").fetchall()
    assert len(rows) == RECORDS  # none twice
    assert sorted((k, p, o) for k, p, o in rows) == sorted(
        (f"v{i}", i % PARTITIONS, i // PARTITIONS) for i in range(RECORDS)
    )  # none missing
