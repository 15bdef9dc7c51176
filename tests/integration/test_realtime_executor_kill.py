"""Real-Time Mode into PostgreSQL, exactly once with an executor killed mid-batch.

The pipeline of ``test_realtime_stream.py`` (``tests/realtime_pipeline.py``: a real topic
on a real broker, each writer) runs on ``local-cluster[2,1,1024]``: two executor JVMs in
processes of their own, one task slot each, one per Kafka partition. Once both partitions'
first rows are committed (their markers in PostgreSQL) and the first long batch still runs,
one executor process (``CoarseGrainedExecutorBackend``) is killed with SIGKILL. The test
asserts the kill fired (the process existed and is gone, and Spark logged the executor
lost with exit code 137), that the standalone worker started a new executor and the
query never failed, then checks with SQL that every record is in the table once and the
markers are at the last offsets.

Observed on Spark 4.2.0: no record the markers covered reached a writer again after the
kill (with the JVM writer's skip removed, no row was doubled), so this test does not
guard the skip; the retried task and the driver kill do (``test_realtime_faults.py``,
``test_realtime_stream.py``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import psycopg
import pytest

from reconcile.testing.kafka_broker import KafkaBroker
from tests.fix_kafka import create_topic
from tests.integration.test_realtime_faults import each_record_once, writer_args
from tests.integration.test_realtime_stream import (
    ENV,
    FIRST,
    PARTITIONS,
    RECORDS,
    REPO,
    command,
    generations,
    produce,
)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.chaos,
    pytest.mark.timeout(1200),
]

MASTER = "local-cluster[2,1,1024]"
EXECUTOR_CLASS = b"org.apache.spark.executor.CoarseGrainedExecutorBackend"


def parent_of(pid: int) -> int:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    for line in status.splitlines():
        if line.startswith("PPid:"):
            return int(line.split()[1])
    return 0


def executors_under(root: int) -> set[int]:
    """The live executor JVMs descended from ``root`` (other sessions' are not counted)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if EXECUTOR_CLASS not in cmdline:
            continue
        pid = ancestor = int(entry.name)
        while ancestor > 1 and ancestor != root:
            ancestor = parent_of(ancestor)
        if ancestor == root and alive(pid):
            found.add(pid)
    return found


def alive(pid: int) -> bool:
    """``pid`` runs (a zombie, killed and not yet reaped, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def markers(dsn: str, topic: str) -> dict[int, int]:
    """Each partition's marker: the highest offset the target holds."""
    with psycopg.connect(dsn) as conn:
        made = conn.execute("SELECT to_regclass('reconcile.reconcile_realtime_offsets')")
        if (made.fetchone() or (None,))[0] is None:
            return {}  # the driver has not created the marker table yet
        found = conn.execute(
            "SELECT kafka_partition, last_offset FROM reconcile.reconcile_realtime_offsets "
            "WHERE pipeline = 'rt' AND sink = 'events' AND topic = %s",
            (topic,),
        ).fetchall()
    return {int(p): int(o) for p, o in found}


def wait_for(what: str, check: object, driver: subprocess.Popen[str], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not check():  # type: ignore[operator]
        assert driver.poll() is None, driver.communicate()[1][-3000:]
        assert time.monotonic() < deadline, f"no {what} within {seconds} s"
        time.sleep(0.1)


@pytest.mark.spark  # in a subprocess
@pytest.mark.parametrize("kind", ["jvm", "python"])
def test_an_executor_killed_mid_batch_is_replaced_and_each_record_lands_once(
    kind: str,
    kafka_broker: KafkaBroker,
    pg_db: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    topic = create_topic(kafka_broker, "rt", PARTITIONS)
    produce(kafka_broker, topic, range(FIRST))
    driver = subprocess.Popen(
        command(kafka_broker, topic, pg_db, tmp_path, writer_args(kind, request)), cwd=REPO,
        # Three JVMs and their Python workers start on two cores: more time than local[2].
        env={**ENV, "RT_MASTER": MASTER, "RT_SECONDS": "600"},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        # Both tasks of the first long batch have committed rows: each partition has a marker.
        wait_for("marker on each partition",
                 lambda: len(markers(pg_db, topic)) == PARTITIONS, driver, 300)  # fmt: skip
        before = executors_under(driver.pid)
        assert len(before) == 2, before  # local-cluster's two executor JVMs
        claimed = generations(pg_db, topic)
        victim = min(before)
        os.kill(victim, signal.SIGKILL)
        wait_for("end of the killed executor", lambda: not alive(victim), driver, 30)
        # The worker starts an executor in its place, where Spark runs the lost task again.
        wait_for("new executor", lambda: executors_under(driver.pid) - before, driver, 180)
        produce(kafka_broker, topic, range(FIRST, RECORDS))
        out, err = driver.communicate(timeout=660)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.communicate()
    assert driver.returncode == 0, err[-3000:]
    assert '"restarts": 0' in out, out  # Spark retried the task; the query never failed
    # Spark saw the executor die of the signal (128 + 9), and the query went on.
    assert "Lost executor" in err and "exited with code 137" in err, err[-3000:]
    each_record_once(pg_db, f"{out}\n{err[-3000:]}")
    per_partition = RECORDS // PARTITIONS
    assert markers(pg_db, topic) == {p: per_partition - 1 for p in range(PARTITIONS)}
    # The killed task's partition was written after the kill by a new task, which claimed it
    # anew (the other partition's task may have lived on and written the rest itself).
    after = generations(pg_db, topic)
    assert any(after[p] > g for p, g in claimed.items()), (claimed, after)
