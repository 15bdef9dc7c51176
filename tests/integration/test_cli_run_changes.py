"""Changing a pipeline through ``reconcile run``: real processes, real Spark, real Postgres.

- An app that starts emitting a new column, run on the default staging path
  (``via = "auto"``) and then on the executors' (``via = "executors"``), into
  a database whose defaults are hostile (``DateStyle`` 'SQL, DMY', a far time
  zone, rounded floats): each run exits 0, the table and the store gain the
  column, the rows are exact and a verify finds nothing. (The new column used
  to stop the default path: "the micro-batch has column 'label', which table
  ... does not have".)
- After ``rebuild --apply --app NEW --logic-version NAME``, pointing the run
  table's ``app`` at NEW is all it takes: the run carries NAME.

Slow: each ``reconcile run`` starts a Spark of its own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from tests.cli_run import REPO
from tests.fix_pg import PASSWORD, PgServer
from tests.integration.test_cli_config import password_dsn

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROWS_PER_FILE = 10

APP = '''
"""The test's apps over JSON files of (id, qty): as they are, and with new columns."""

from pyspark.sql import functions as F
from pyspark.sql import types as T

SCHEMA = T.StructType([T.StructField("id", T.LongType()), T.StructField("qty", T.LongType())])


def _source(spark):
    return spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json({inbox!r})


def lines(spark, pipeline):
    return _source(spark), None


def labelled(spark, pipeline):
    return _source(spark).withColumn("label", F.concat(F.lit("l"), F.col("id"))), None


def noted(spark, pipeline):
    df = _source(spark).withColumn("label", F.concat(F.lit("l"), F.col("id")))
    # F.when: a nullable column (a bare literal would be NOT NULL, which no table gains).
    return df.withColumn("note", F.when(F.col("id") >= 0, F.lit("n"))), None


def doubled(spark, pipeline):
    return _source(spark).withColumn("qty", F.col("qty") * 2), None
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

[pipelines.orders.run]
app = "changes_app:{app}"
checkpoint = "state/checkpoint"
trigger = "available-now"
via = "{via}"
master = "local[1]"
{logic}

[pipelines.orders.run.spark]
"spark.sql.shuffle.partitions" = "1"
"spark.driver.memory" = "768m"
"""

HOSTILE = {
    "DateStyle": "SQL, DMY",
    "IntervalStyle": "postgres_verbose",
    "TimeZone": "Pacific/Chatham",
    "extra_float_digits": "-15",
    "bytea_output": "escape",
    "standard_conforming_strings": "off",
}


class Changes:
    """The config file, the app and the inbox of one test; runs the CLI against them."""

    def __init__(self, dsn: str, tmp_path: Path) -> None:
        self.dsn, self.tmp = dsn, tmp_path
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                "CREATE TABLE order_lines (id bigint PRIMARY KEY, qty bigint, _epoch bigint)"
            )
        self.inbox = tmp_path / "inbox"
        self.inbox.mkdir()
        (tmp_path / "app").mkdir()
        (tmp_path / "app" / "changes_app.py").write_text(APP.format(inbox=str(self.inbox)))
        self.config = tmp_path / "reconcile.toml"
        self.env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "RUN_PG_PASSWORD": PASSWORD,
                    "PYTHONPATH": os.pathsep.join([str(REPO), str(tmp_path / "app")])}  # fmt: skip
        self.files = 0

    def configure(self, app: str, via: str = "auto", logic_version: str | None = None) -> None:
        logic = f'logic_version = "{logic_version}"' if logic_version else ""
        self.config.write_text(
            CONFIG.format(dsn=password_dsn(self.dsn), app=app, via=via, logic=logic)
        )

    def drop(self) -> list[int]:
        """The next file of rows into the watched folder, whole (written aside, then renamed)."""
        n, self.files = self.files, self.files + 1
        ids = list(range(n * ROWS_PER_FILE, (n + 1) * ROWS_PER_FILE))
        aside = self.tmp / f"part-{n:03d}.json"
        aside.write_text("".join(json.dumps({"id": i, "qty": i * 3}) + "\n" for i in ids))
        aside.rename(self.inbox / aside.name)
        return ids

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "reconcile.cli", *args, "--config", str(self.config)],
            cwd=self.tmp, env=self.env, capture_output=True, text=True, timeout=600,
        )  # fmt: skip

    def run(self) -> None:
        ran = self.cli("run", "--pipeline", "orders")
        assert ran.returncode == 0, ran.stderr[-4000:]
        assert PASSWORD not in ran.stderr

    def rows(self, columns: str) -> dict[int, tuple[Any, ...]]:
        with psycopg.connect(self.dsn, options="-c DateStyle=ISO") as conn:
            found = conn.execute(f"SELECT id, {columns} FROM order_lines").fetchall()
        return {r[0]: tuple(r[1:]) for r in found}


def _hostile(server: PgServer, dsn: str) -> None:
    name = conninfo_to_dict(dsn)["dbname"]
    with psycopg.connect(server.dsn(), autocommit=True) as conn:
        for setting, value in HOSTILE.items():
            conn.execute(
                sql.SQL("ALTER DATABASE {} SET {} = {}").format(
                    sql.Identifier(str(name)), sql.Identifier(setting), sql.Literal(value)
                )
            )


@pytest.mark.spark  # in a subprocess
@pytest.mark.timeout(1800)
def test_a_new_column_through_reconcile_run_on_every_staging_path_under_hostile_defaults(
    pg_server: PgServer, pg_db: str, tmp_path: Path
) -> None:
    _hostile(pg_server, pg_db)
    pipeline = Changes(pg_db, tmp_path)
    pipeline.configure("lines")
    first = pipeline.drop() + pipeline.drop()
    pipeline.run()
    pipeline.configure("labelled")  # the default path: via = "auto"
    second = pipeline.drop()
    pipeline.run()
    pipeline.configure("noted", via="executors")
    third = pipeline.drop()
    pipeline.run()  # its batch brings "note": the driver's way, then the executors'
    fourth = pipeline.drop()
    pipeline.run()  # the executors' staging table of the new columns
    want = {i: (i * 3, None, None) for i in first}
    want |= {i: (i * 3, f"l{i}", None) for i in second}
    want |= {i: (i * 3, f"l{i}", "n") for i in third + fourth}
    assert pipeline.rows("qty, label, note") == want
    with psycopg.connect(pipeline.dsn) as conn:  # the executors' staging table of the new columns
        staged = conn.execute(
            "SELECT count(*) FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid "
            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'reconcile' "
            "AND c.relkind = 'r' AND c.relname LIKE '\\_reconcile\\_stage\\_%' "
            "AND a.attname = 'note'"
        ).fetchone()
    assert staged == (1,)
    verify = pipeline.cli("verify", "--all", "--mode", "full", "--json")
    assert verify.returncode == 0, (verify.stdout, verify.stderr[-3000:])
    (table,) = json.loads(verify.stdout)["tables"]
    assert (table["rows_pulled"], table["missing"], table["extra"], table["changed"]) == (
        len(want), 0, 0, 0)  # fmt: skip


@pytest.mark.spark  # in a subprocess
@pytest.mark.timeout(1800)
def test_after_a_rebuild_the_rebuilt_app_runs_as_the_rebuild_s_logic(
    pg_db: str, tmp_path: Path
) -> None:
    pipeline = Changes(pg_db, tmp_path)
    pipeline.configure("lines", logic_version="2026-11")
    ids = pipeline.drop() + pipeline.drop()
    pipeline.run()
    applied = pipeline.cli("rebuild", "--pipeline", "orders", "--apply", "--json", "--app",
                           "changes_app:doubled", "--logic-version", "2026-12")  # fmt: skip
    assert applied.returncode == 0, applied.stderr[-3000:]
    assert json.loads(applied.stdout)["step"] == "switched"
    # Only the app changes in the run table: its logic_version still names the old logic.
    pipeline.configure("doubled", logic_version="2026-11")
    more = pipeline.drop()
    pipeline.run()
    assert pipeline.rows("qty") == {i: (i * 6,) for i in ids + more}
    # The old app is refused, naming both logics.
    pipeline.configure("lines", logic_version="2026-11")
    refused = pipeline.cli("run", "--pipeline", "orders")
    assert refused.returncode == 2
    assert "runs logic '2026-11', but its sinks hold logic '2026-12'" in refused.stderr
