"""``reconcile rebuild`` from a config file: real processes, real Spark, real Postgres.

A pipeline streams JSON files (one per micro-batch) into two sink tables with
logic v1 (``reconcile run``, available-now). ``rebuild --plan`` counts what
the app's logic v2 changes and writes nothing; ``rebuild --apply --app v2``
writes only those rows (Postgres's own counters say so) and switches the
pipeline: a run of the old app is refused with exit 2 naming both logic
versions, a run of v2 takes the next file from the next epoch. The second
test rebuilds while a main and a standby run: both step aside for it and
refuse to lead with the old logic afterwards; a run of v2 then finishes.
Every check reads the tables in Postgres.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.cli_run import REPO
from tests.fix_pg import PASSWORD
from tests.integration.test_cli_config import password_dsn

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROWS_PER_FILE = 20

APP = '''
"""The test's apps: v1 and its fixed logic v2, over JSON files of (id, qty)."""

from pyspark.sql import functions as F
from pyspark.sql import types as T

SCHEMA = T.StructType([T.StructField("id", T.LongType()), T.StructField("qty", T.LongType())])


def _source(spark):
    return spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json({inbox!r})


def lines(spark, pipeline):
    return _source(spark), {{"evens": lambda batch: batch.where(F.col("id") % 2 == 0)}}


def lines_v2(spark, pipeline):
    fixed = _source(spark).where(F.col("id") % 7 != 0).withColumn(
        "qty", F.when(F.col("id") % 5 == 0, F.col("qty") + 1).otherwise(F.col("qty"))
    )
    return fixed, {{"evens": lambda batch: batch.where(F.col("id") % 2 == 0)}}
'''

CONFIG = """
[store]
root = "expected"

[metrics]
port = 0

[pipelines.orders.sinks.lines]
dsn = "{dsn}"
password_env = "RUN_PG_PASSWORD"
table = "order_lines"
keys = ["id"]

[pipelines.orders.sinks.evens]
dsn = "{dsn}"
password_env = "RUN_PG_PASSWORD"
table = "evens"
keys = ["id"]

[pipelines.orders.run]
app = "{app}"
checkpoint = "state/checkpoint"
trigger = "{trigger}"
lease_term_s = 2
master = "local[1]"

[pipelines.orders.run.spark]
"spark.sql.shuffle.partitions" = "1"
"spark.driver.memory" = "768m"
"""


def v1(i: int) -> int | None:
    return i * 3


def v2(i: int) -> int | None:
    return None if i % 7 == 0 else i * 3 + (1 if i % 5 == 0 else 0)


def query(dsn: str, statement: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(statement)
        return cur.fetchall() if cur.description is not None else []


def drop(inbox: Path, number: int) -> list[int]:
    ids = list(range(number * ROWS_PER_FILE, (number + 1) * ROWS_PER_FILE))
    aside = inbox.parent / f"part-{number:03d}.json"
    aside.write_text("".join(json.dumps({"id": i, "qty": i * 3}) + "\n" for i in ids))
    aside.rename(inbox / aside.name)
    return ids


def expected(logic: Any, ids: list[int], evens: bool = False) -> dict[int, int]:
    rows = {i: logic(i) for i in ids if not evens or i % 2 == 0}
    return {i: q for i, q in rows.items() if q is not None}


def table(dsn: str, name: str) -> dict[int, int]:
    rows = query(dsn, f"SELECT id, qty FROM {name}")
    assert len(rows) == len({r[0] for r in rows}), f"{name}: a key twice"
    assert not query(dsn, f"SELECT 1 FROM {name} WHERE _epoch IS NULL"), f"{name}: no epoch"
    return {r[0]: r[1] for r in rows}


def written(dsn: str) -> int:
    query(dsn, "SELECT pg_stat_clear_snapshot()")
    found = query(dsn, "SELECT sum(n_tup_ins + n_tup_upd + n_tup_del) FROM pg_stat_user_tables "
                       "WHERE relname IN ('order_lines', 'evens')")  # fmt: skip
    return int(found[0][0])


class Pipeline:
    """The config file, the app and the inbox of one test; runs the CLI against them."""

    def __init__(self, dsn: str, tmp_path: Path) -> None:
        self.dsn, self.tmp = dsn, tmp_path
        query(dsn, "CREATE TABLE order_lines (id bigint PRIMARY KEY, qty bigint, _epoch bigint)")
        query(dsn, "CREATE TABLE evens (id bigint PRIMARY KEY, qty bigint, _epoch bigint)")
        self.inbox = tmp_path / "inbox"
        self.inbox.mkdir()
        (tmp_path / "app").mkdir()
        (tmp_path / "app" / "rebuild_test_app.py").write_text(APP.format(inbox=str(self.inbox)))
        self.config = tmp_path / "reconcile.toml"
        self.env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "RUN_PG_PASSWORD": PASSWORD,
                    "PYTHONPATH": os.pathsep.join([str(REPO), str(tmp_path / "app")])}  # fmt: skip
        self.procs: list[subprocess.Popen[bytes]] = []

    def configure(self, app: str, trigger: str = "available-now") -> None:
        self.config.write_text(CONFIG.format(dsn=password_dsn(self.dsn), app=app, trigger=trigger))

    def cli(self, *args: str, timeout: float = 300,
            module: str = "reconcile.cli") -> subprocess.CompletedProcess[str]:  # fmt: skip
        return subprocess.run(
            [sys.executable, "-m", module, *args, "--config", str(self.config),
             "--pipeline", "orders"],
            cwd=REPO, env=self.env, capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip

    def start(self, *args: str, log: str) -> subprocess.Popen[bytes]:
        with (self.tmp / log).open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "reconcile.cli", "run", "--config", str(self.config),
                 "--pipeline", "orders", *args],
                cwd=REPO, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        self.procs.append(proc)
        return proc

    def log(self, name: str) -> str:
        return (self.tmp / name).read_text()


@pytest.fixture
def pipeline(pg_db: str, tmp_path: Path) -> Iterator[Pipeline]:
    made = Pipeline(pg_db, tmp_path)
    yield made
    for proc in made.procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.mark.timeout(900)
@pytest.mark.spark  # in a subprocess
def test_rebuild_plans_applies_only_the_changes_and_switches_the_logic(
    pipeline: Pipeline,
) -> None:
    dsn = pipeline.dsn
    pipeline.configure("rebuild_test_app:lines")
    ids = [i for n in range(3) for i in drop(pipeline.inbox, n)]
    ran = pipeline.cli("run")
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert table(dsn, "order_lines") == expected(v1, ids)

    # The plan as the Spark job spark-submit runs (its entry point, a session it did not start).
    planned = pipeline.cli("rebuild", "--plan", "--app", "rebuild_test_app:lines_v2", "--json",
                           "--master", "local[1]", module="reconcile.cli.spark_submit")  # fmt: skip
    assert planned.returncode == 0, planned.stderr[-3000:]
    plan = json.loads(planned.stdout)
    old, new = expected(v1, ids), expected(v2, ids)
    lines = plan["tables"]["lines"]["plan"]
    assert (lines["inserts"], lines["deletes"]) == (0, len(set(old) - set(new)))
    assert lines["updates"] == sum(1 for i in new if new[i] != old[i])
    assert table(dsn, "order_lines") == old  # the plan wrote nothing
    changed = lines["changed"] + plan["tables"]["evens"]["plan"]["changed"]

    before = written(dsn)
    applied = pipeline.cli("rebuild", "--apply", "--app", "rebuild_test_app:lines_v2",
                           "--part-rows", "7", "--json")  # fmt: skip
    assert applied.returncode == 0, applied.stderr[-3000:]
    report = json.loads(applied.stdout)
    assert report["step"] == "switched" and report["base_epoch"] == 2
    assert table(dsn, "order_lines") == new
    assert table(dsn, "evens") == expected(v2, ids, evens=True)
    deadline = time.monotonic() + 15
    while written(dsn) - before < changed and time.monotonic() < deadline:
        time.sleep(0.2)
    assert written(dsn) - before == changed  # Postgres counted only the changed rows

    more = drop(pipeline.inbox, 3)
    refused = pipeline.cli("run")
    assert refused.returncode == 2
    assert ("runs logic 'rebuild_test_app:lines', but its sinks hold logic "
            "'rebuild_test_app:lines_v2'") in refused.stderr.strip().splitlines()[-1]  # fmt: skip
    assert table(dsn, "order_lines") == new
    pipeline.configure("rebuild_test_app:lines_v2")
    ran = pipeline.cli("run")
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert table(dsn, "order_lines") == expected(v2, ids + more)
    assert PASSWORD not in ran.stderr + applied.stderr + planned.stderr + refused.stderr


def holder(dsn: str) -> str | None:
    found = query(dsn, "SELECT holder FROM reconcile.reconcile_leases WHERE pipeline = 'orders' "
                       "AND expires_at > clock_timestamp()")  # fmt: skip
    return str(found[0][0]) if found else None


def wait_for(what: str, check: Any, deadline: float) -> None:
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.25)


@pytest.mark.timeout(900)
@pytest.mark.spark  # in a subprocess
def test_a_rebuild_while_a_main_and_a_standby_run_makes_both_step_aside(
    pipeline: Pipeline,
) -> None:
    dsn = pipeline.dsn
    pipeline.configure("rebuild_test_app:lines", trigger="1 second")
    deadline = time.monotonic() + 400
    ids = drop(pipeline.inbox, 0) + drop(pipeline.inbox, 1)
    main = pipeline.start(log="main.log")
    wait_for("the main's rows", lambda: len(table(dsn, "order_lines")) == len(ids), deadline)
    standby = pipeline.start("--standby", log="standby.log")
    wait_for("the standby to follow", lambda: "running as standby" in pipeline.log("standby.log"),
             deadline)  # fmt: skip
    applied = pipeline.cli("rebuild", "--apply", "--app", "rebuild_test_app:lines_v2", "--json")
    assert applied.returncode == 0, applied.stderr[-3000:]
    report = json.loads(applied.stdout)
    assert report["step"] == "switched"
    through = report["base_epoch"]
    # The main stepped down for the rebuild; neither leads with the old logic after it.
    for proc in (main, standby):
        assert proc.wait(timeout=120) == 2
    logs = pipeline.log("main.log") + pipeline.log("standby.log")
    assert "stepped_down" in pipeline.log("main.log")
    # Neither led again: the main led once, before the rebuild; the standby never.
    assert pipeline.log("main.log").count("orders: leading (") == 1
    assert "orders: leading (" not in pipeline.log("standby.log")
    assert "hold logic 'rebuild_test_app:lines_v2'" in logs
    assert holder(dsn) is None
    assert table(dsn, "order_lines") == expected(v2, ids)
    assert through >= 1
    more = drop(pipeline.inbox, 2)
    pipeline.configure("rebuild_test_app:lines_v2", trigger="available-now")
    ran = pipeline.cli("run")
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert table(dsn, "order_lines") == expected(v2, ids + more)
    assert table(dsn, "evens") == expected(v2, ids + more, evens=True)
