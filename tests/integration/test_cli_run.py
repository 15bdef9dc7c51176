"""``reconcile run`` as a main and a ``--standby``: real processes, real Spark, real Postgres.

The main streams JSON files from a watched folder into two sink tables; it is
SIGKILLed once rows of it are in Postgres; the standby takes the lease over
and finishes; every input row is then in each table exactly once. SIGTERM
stops the standby with exit 0 and its lease released.

An epoch the database rejects (a CHECK constraint) stops the process within a
bounded time with exit 3, its last line naming the epoch, the table and the
constraint, after one writer generation and with no marker of that epoch.
Ctrl-C (SIGINT to the process group) stops it with exit 0 and one last line.
The checks of the config and the app are in ``test_cli_run_app.py``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from deltalake import DeltaTable
from psycopg import sql

from expected_state.progress_log import StoreProgressLog, progress_fence_id
from tests.cli_run import REPO
from tests.fix_pg import PASSWORD, markers_table
from tests.integration.test_cli_config import password_dsn

pytestmark = [pytest.mark.integration]

FILES = 8
ROWS_PER_FILE = 25
# From the first process's start to the last row in Postgres: a bound for liveness, not a
# speed target (two Spark starts take 30 to 60 s each on a loaded 2-core machine).
DEADLINE_S = 240.0

APP = '''
"""The test's app: JSON files from a folder, one per micro-batch; evens go to a second sink."""

from pyspark.sql import functions as F
from pyspark.sql import types as T

SCHEMA = T.StructType([T.StructField("id", T.LongType()), T.StructField("qty", T.LongType())])


def lines(spark, pipeline):
    df = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json({inbox!r})
    return df, {{"evens": lambda batch: batch.where(F.col("id") % 2 == 0)}}
'''

CONFIG = """
[store]
root = "expected"

[metrics]
port = 0  # a free port each: main and standby run on one host here

[pipelines.orders.sinks.lines]
dsn = "{dsn}"
password_env = "RUN_PG_PASSWORD"
table = "shop.order_lines"
keys = ["id"]

[pipelines.orders.sinks.evens]
dsn = "{dsn}"
password_env = "RUN_PG_PASSWORD"
table = "evens"
keys = ["id"]

[pipelines.orders.run]
app = "ha_test_app:lines"
checkpoint = "state/checkpoint"
lease_term_s = 2
master = "local[1]"

[pipelines.orders.run.spark]
"spark.sql.shuffle.partitions" = "1"
"spark.driver.memory" = "768m"
"""


Popen = subprocess.Popen[bytes]


def query(dsn: str, statement: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(statement)
        return cur.fetchall() if cur.description is not None else []


def wait_for(what: str, check: Callable[[], bool], deadline: float, *procs: Popen) -> None:
    while not check():
        for proc in procs:
            if proc.poll() is not None:
                pytest.fail(f"waiting for {what}: {proc.args} exited {proc.returncode}")
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.25)


@pytest.fixture
def started(tmp_path: Path) -> Iterator[Callable[..., Popen]]:
    """Starts ``reconcile run`` processes (each in a session of its own); kills what is left."""
    procs: list[Popen] = []
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), str(tmp_path / "app")]),
        "PYSPARK_PYTHON": sys.executable,
        "RUN_PG_PASSWORD": PASSWORD,
    }

    def start(*extra: str, log: str) -> Popen:
        cmd = [sys.executable, "-m", "reconcile.cli", "run", "--config",
               str(tmp_path / "reconcile.toml"), "--pipeline", "orders", *extra]  # fmt: skip
        with (tmp_path / log).open("wb") as out:
            proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)  # fmt: skip
        procs.append(proc)
        return proc

    yield start
    for proc in procs:  # the JVM and Python workers too: the whole session of each
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def drop(inbox: Path, number: int) -> set[int]:
    """File ``number`` into the watched folder, whole (written aside, then renamed in)."""
    ids = range(number * ROWS_PER_FILE, (number + 1) * ROWS_PER_FILE)
    aside = inbox.parent / f"part-{number:03d}.json"
    aside.write_text("".join(json.dumps({"id": i, "qty": i * 3}) + "\n" for i in ids))
    aside.rename(inbox / aside.name)
    return set(ids)


def holder_pid(dsn: str) -> tuple[int, int] | None:
    """(the pid in the lease holder's name, the tenure) of a live lease, or None."""
    try:
        found = query(
            dsn,
            "SELECT holder, tenure FROM reconcile.reconcile_leases WHERE pipeline = 'orders' "
            "AND expires_at > clock_timestamp()",
        )
    except psycopg.errors.UndefinedTable:  # no instance has tried for the lease yet
        return None
    return (int(found[0][0].split(":")[1]), int(found[0][1])) if found else None


@pytest.mark.timeout(900)  # two `reconcile run` processes, each with its own Spark
@pytest.mark.spark  # in a subprocess
def test_the_standby_takes_over_a_killed_main_and_every_row_is_in_once(
    pg_db: str, tmp_path: Path, started: Callable[..., Popen]
) -> None:
    query(pg_db, "CREATE SCHEMA shop")
    query(pg_db, "CREATE TABLE shop.order_lines (id bigint PRIMARY KEY, qty bigint, _epoch bigint)")
    query(pg_db, "CREATE TABLE evens (id bigint PRIMARY KEY, qty bigint, _epoch bigint)")
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "ha_test_app.py").write_text(APP.format(inbox=str(inbox)))
    (tmp_path / "reconcile.toml").write_text(CONFIG.format(dsn=password_dsn(pg_db)))
    began = time.monotonic()
    deadline = began + DEADLINE_S

    main = started(log="main.log")
    sent = drop(inbox, 0) | drop(inbox, 1)
    wait_for("the main to lead", lambda: (holder_pid(pg_db) or (0, 0))[0] == main.pid,
             deadline, main)  # fmt: skip
    tenure = (holder_pid(pg_db) or (0, 0))[1]

    def count() -> int:
        return int(query(pg_db, "SELECT count(*) FROM shop.order_lines")[0][0])

    wait_for("the main's first commit", lambda: count() > 0, deadline, main)
    # The standby starts once the main leads: started together, whichever
    # Spark came up first would lead (a standby waits only one term).
    standby = started("--standby", log="standby.log")
    wait_for("the standby to follow",
             lambda: "running as standby" in (tmp_path / "standby.log").read_text(),
             deadline, main, standby)  # fmt: skip
    assert (holder_pid(pg_db) or (0, 0))[0] == main.pid
    for number in range(2, FILES // 2):
        sent |= drop(inbox, number)
    time.sleep(0.5)  # into the next micro-batches, very likely mid-epoch
    os.kill(main.pid, signal.SIGKILL)
    main.wait()
    killed_with = count()
    for number in range(FILES // 2, FILES):
        sent |= drop(inbox, number)

    def standby_leads() -> bool:
        now = holder_pid(pg_db)
        return now is not None and now[0] == standby.pid and now[1] > tenure

    wait_for("the standby to take over", standby_leads, deadline, standby)
    wait_for("every row", lambda: count() == len(sent), deadline, standby)
    took = time.monotonic() - began
    url = re.search(r"metrics: (http://\S+)", (tmp_path / "standby.log").read_text())
    assert url is not None
    with urllib.request.urlopen(url[1], timeout=10) as response:
        scraped = response.read().decode()
    assert re.search(r'reconcile_ha_leader\{[^}]*pipeline="orders"[^}]*\} 1\.0', scraped)

    # Exactly once, in both sinks: nothing missing, nothing doubled, values as sent.
    for table, wanted in (("shop.order_lines", sent), ("evens", {i for i in sent if i % 2 == 0})):
        rows = query(pg_db, f"SELECT id, qty FROM {table}")
        ids = [r[0] for r in rows]
        assert len(ids) == len(set(ids)), f"{table}: duplicate ids"
        assert set(ids) == wanted, f"{table}: missing {sorted(wanted - set(ids))[:10]}"
        assert all(qty == i * 3 for i, qty in rows), f"{table}: wrong values"

    standby.send_signal(signal.SIGTERM)
    assert standby.wait(timeout=60) == 0
    assert holder_pid(pg_db) is None  # released at once, not left to run out
    standby_log = (tmp_path / "standby.log").read_text()
    main_log = (tmp_path / "main.log").read_text()
    assert "running as standby" in standby_log and "running as main" in main_log
    assert "orders: leading (" in standby_log and "orders: leading (" in main_log
    assert "stopped; lease released" in standby_log
    for log in (standby_log, main_log):
        assert PASSWORD not in log
    print(f"main killed with {killed_with} rows in; all {len(sent)} in after {took:.1f}s")


def run_env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(tmp_path / "app")]),
            "PYSPARK_PYTHON": sys.executable, "RUN_PG_PASSWORD": PASSWORD}  # fmt: skip


# Who rejects epoch 1's bad row, its value of qty, and how the last line begins.
REJECTED_BY = {
    "database": (-1, "reconcile: error: pipeline orders: epoch 1: rejected by the database: table "
                     "shop.order_lines, constraint qty_not_negative [23514]", "23514"),
    # A NULL in a NOT NULL column: the engine's check finds it before anything
    # is sent. The same exit code and metric as the database's refusal.
    "engine": (None, "reconcile: error: pipeline orders: postgres sink 'lines', table "
                     "shop.order_lines column 'qty' value None: NULL in NOT NULL column", "23502"),
}  # fmt: skip


@pytest.mark.spark  # in a subprocess
@pytest.mark.parametrize("rejected_by", sorted(REJECTED_BY))
def test_a_rejected_epoch_stops_run_with_exit_3_naming_it(
    pg_db: str, tmp_path: Path, rejected_by: str
) -> None:
    bad, line, sqlstate = REJECTED_BY[rejected_by]
    query(pg_db, "CREATE SCHEMA shop")
    query(pg_db, "CREATE TABLE shop.order_lines (id bigint PRIMARY KEY, qty bigint NOT NULL, "
                 "_epoch bigint, CONSTRAINT qty_not_negative CHECK (qty >= 0))")  # fmt: skip
    query(pg_db, "CREATE TABLE evens (id bigint PRIMARY KEY, qty bigint, _epoch bigint)")
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "ha_test_app.py").write_text(APP.format(inbox=str(inbox)))
    prom = tmp_path / "metrics.prom"
    (tmp_path / "reconcile.toml").write_text(
        CONFIG.format(dsn=password_dsn(pg_db)).replace(
            "port = 0  # a free port each: main and standby run on one host here",
            f'textfile = "{prom}"',
        )
    )
    drop(inbox, 0)
    # Epoch 1: one row of 25 breaks a constraint of shop.order_lines.
    aside = tmp_path / "part-001.json"
    aside.write_text("".join(json.dumps({"id": i, "qty": bad if i == 30 else i}) + "\n"
                             for i in range(ROWS_PER_FILE, 2 * ROWS_PER_FILE)))  # fmt: skip
    began = time.monotonic()
    with (tmp_path / "out.log").open("wb") as out, (tmp_path / "err.log").open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "reconcile.cli", "run", "--config",
             str(tmp_path / "reconcile.toml"), "--pipeline", "orders"],
            cwd=REPO, env=run_env(tmp_path), stdout=out, stderr=err, start_new_session=True,
        )  # fmt: skip
    try:
        # Spark's start is slow on a busy machine: the bound that matters is the next one.
        wait_for("epoch 0 in Postgres", lambda: count_rows(pg_db) == ROWS_PER_FILE,
                 began + 240, proc)  # fmt: skip
        aside.rename(inbox / aside.name)
        try:
            code = proc.wait(timeout=90)  # a rejected epoch stops it, rather than loop for ever
        except subprocess.TimeoutExpired:
            pytest.fail("reconcile run still runs 90 s after the rejected epoch arrived")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    stderr = (tmp_path / "err.log").read_text()
    assert code == 3, stderr[-3000:]
    last = stderr.strip().splitlines()[-1]
    assert last.startswith(line) and "epoch 1" in last, last
    assert PASSWORD not in stderr + (tmp_path / "out.log").read_text()
    # The store: one writer generation, claimed by the takeover; no restart claimed another.
    uri = StoreProgressLog(str(tmp_path / "expected"), "orders").uri
    assert DeltaTable(uri).transaction_version(progress_fence_id("orders")) == 1
    # Postgres: epoch 0 in both sinks, nothing of epoch 1; the lease released.
    assert count_rows(pg_db) == ROWS_PER_FILE
    with psycopg.connect(pg_db, autocommit=True) as conn:
        table = markers_table(conn)
        assert table is not None
        marked = conn.execute(sql.SQL("SELECT sink, epoch FROM {} ORDER BY 1, 2").format(table))
        assert marked.fetchall() == [("evens", 0), ("lines", 0)]
    assert holder_pid(pg_db) is None
    assert re.search(r'reconcile_rejected_epochs_total\{pipeline="orders",sink="lines",'
                     rf'sqlstate="{sqlstate}"\}} 1\.0', prom.read_text())  # fmt: skip


def count_rows(dsn: str) -> int:
    try:
        return int(query(dsn, "SELECT count(*) FROM shop.order_lines")[0][0])
    except psycopg.Error:
        return -1


@pytest.mark.slow  # Spark's start and a first epoch: most of a minute here
@pytest.mark.spark  # in a subprocess
def test_ctrl_c_stops_run_cleanly_with_one_last_line(pg_db: str, tmp_path: Path) -> None:
    """SIGINT to the whole process group, as a terminal's Ctrl-C: a clean stop, exit 0.

    PySpark puts its own SIGINT handler in when its context starts (it raises
    a bare KeyboardInterrupt); the command puts the graceful one back.
    """
    query(pg_db, "CREATE SCHEMA shop")
    query(pg_db, "CREATE TABLE shop.order_lines (id bigint PRIMARY KEY, qty bigint, _epoch bigint)")
    query(pg_db, "CREATE TABLE evens (id bigint PRIMARY KEY, qty bigint, _epoch bigint)")
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "ha_test_app.py").write_text(APP.format(inbox=str(inbox)))
    (tmp_path / "reconcile.toml").write_text(CONFIG.format(dsn=password_dsn(pg_db)))
    drop(inbox, 0)
    began = time.monotonic()
    with (tmp_path / "out.log").open("wb") as out, (tmp_path / "err.log").open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "reconcile.cli", "run", "--config",
             str(tmp_path / "reconcile.toml"), "--pipeline", "orders"],
            cwd=REPO, env=run_env(tmp_path), stdout=out, stderr=err, start_new_session=True,
        )  # fmt: skip
    try:
        wait_for("epoch 0 in Postgres", lambda: count_rows(pg_db) == ROWS_PER_FILE,
                 began + 240, proc)  # fmt: skip
        os.killpg(proc.pid, signal.SIGINT)
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail("reconcile run still runs 60 s after Ctrl-C")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    stderr = (tmp_path / "err.log").read_text()
    assert code == 0, stderr[-3000:]
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr[-3000:]
    assert stderr.strip().splitlines()[-1] == (
        "reconcile run: pipeline orders stopped by SIGINT: the query stopped and the lease was "
        "released"
    )
    assert holder_pid(pg_db) is None  # released at once, not left to run out
    assert count_rows(pg_db) == ROWS_PER_FILE
