"""Real-Time Mode into PostgreSQL, exactly once through a retried task and a server restart.

The same pipeline as ``test_realtime_stream.py`` (``tests/realtime_pipeline.py``: a real
topic on a real broker, each writer), with a fault at another point of the path:

- a task retried: the target has a trigger that fails one insert once (a sequence, which
  no rollback takes back, counts each time it is reached), after the task committed
  transactions before it; the session is ``local[2,4]``, so Spark retries the task;
- a PostgreSQL restart: the test's own server is stopped (``-m fast``, every connection
  cut) and started while the query runs; the writer's commit fails and the batch runs
  again (the task retried, or the query started again on its checkpoint).

Each asserts its fault fired and checks with SQL that every record is in the table once.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import psycopg
import pytest

from reconcile.testing.kafka_broker import KafkaBroker
from tests.fix_kafka import create_topic
from tests.fix_pg import PgServer
from tests.integration.test_realtime_stream import (
    ENV,
    FIRST,
    PARTITIONS,
    RECORDS,
    REPO,
    command,
    count,
    generations,
    produce,
)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.chaos,
    pytest.mark.timeout(900),
]

TABLE = "CREATE TABLE events (k text NOT NULL, topic text, part int, off bigint)"
# Fails the insert of partition 0's offset POISON the first time it is reached. nextval() is
# not transactional: the count survives the failed transaction, so the test can tell the
# fault fired (1) and that a later attempt reached the record again (2).
POISON = 42
FAIL_ONCE = f"""
CREATE SEQUENCE fault_reached;
CREATE FUNCTION fail_once() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.part = 0 AND NEW.off = {POISON} THEN
    IF nextval('fault_reached') = 1 THEN
      RAISE EXCEPTION 'injected fault at offset {POISON}';
    END IF;
  END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER fail_once BEFORE INSERT ON events FOR EACH ROW EXECUTE FUNCTION fail_once();
"""


def writer_args(kind: str, request: pytest.FixtureRequest) -> list[str]:
    if kind == "jvm":
        return [kind, str(request.getfixturevalue("realtime_writer_jar"))]
    return [kind]


def each_record_once(dsn: str, log: str = "") -> None:
    """Every record in ``events`` once (``log``: the driver's, shown when it is not)."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT k, part, off FROM events").fetchall()
    assert len(rows) == RECORDS, log  # none twice
    assert sorted((k, p, o) for k, p, o in rows) == sorted(
        (f"v{i}", i % PARTITIONS, i // PARTITIONS) for i in range(RECORDS)
    ), log  # none missing, each from its own offset


def run(argv: list[str], **env: str) -> dict[str, int]:
    done = subprocess.run(argv, cwd=REPO, env={**ENV, **env}, capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


@pytest.mark.spark  # in a subprocess
@pytest.mark.parametrize("kind", ["python", "jvm"])
def test_a_task_that_fails_after_committing_is_retried_and_lands_each_record_once(
    kind: str,
    kafka_broker: KafkaBroker,
    pg_db: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute(TABLE)
        conn.execute(FAIL_ONCE)
    topic = create_topic(kafka_broker, "rt", PARTITIONS)
    produce(kafka_broker, topic, range(RECORDS))
    # local[2,4]: two task slots, and up to four attempts of a task.
    result = run(command(kafka_broker, topic, pg_db, tmp_path, writer_args(kind, request)),
                 RT_MASTER="local[2,4]")  # fmt: skip
    assert result["restarts"] == 0  # Spark retried the task; the query never failed
    with psycopg.connect(pg_db) as conn:
        reached = conn.execute("SELECT last_value FROM fault_reached").fetchone()
    # 1: the fault fired (the insert failed once); 2: a later attempt reached the record again.
    assert reached is not None and reached[0] == 2
    each_record_once(pg_db)
    # The failing task had committed partition 0 up to the transaction before the fault
    # (five rows a transaction); its retry claimed the partition anew, past the marker.
    assert generations(pg_db, topic)[0] >= 2


@pytest.mark.spark  # in a subprocess
@pytest.mark.parametrize("kind", ["python", "jvm"])
def test_a_postgres_restart_mid_stream_is_ridden_out_exactly_once(
    kind: str,
    kafka_broker: KafkaBroker,
    private_pg_server: PgServer,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    server = private_pg_server
    dsn = server.dsn(server.create_database())
    with psycopg.connect(dsn) as conn:
        started = conn.execute("SELECT pg_postmaster_start_time()").fetchone()
    topic = create_topic(kafka_broker, "rt", PARTITIONS)
    produce(kafka_broker, topic, range(FIRST))
    driver = subprocess.Popen(
        command(kafka_broker, topic, dsn, tmp_path, writer_args(kind, request)), cwd=REPO,
        env={**ENV, "RT_MASTER": "local[2,4]", "RT_RESTARTS": "5"},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        while count(dsn) == 0 and driver.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert driver.poll() is None, driver.communicate()[1][-3000:]
        # Every connection is cut (the writers' among them), in the middle of the batch.
        server.shutdown("fast")
        time.sleep(1)
        server.start()
        with psycopg.connect(dsn) as conn:
            restarted = conn.execute("SELECT pg_postmaster_start_time()").fetchone()
        assert restarted != started  # the fault fired
        produce(kafka_broker, topic, range(FIRST, RECORDS))
        out, err = driver.communicate(timeout=600)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.communicate()
    assert driver.returncode == 0, err[-3000:]
    each_record_once(dsn, f"{out}\n{err[-3000:]}")
    # The batch ran again past the restart: a writer claimed a partition anew.
    assert max(generations(dsn, topic).values()) >= 2, (out, err[-3000:])
