"""``reconcile run`` whose lease the role may not create: exit 2, one line saying what to do.

Before, the lease's CREATE TABLE failed as a RetryableError, and the node tried
for the lease every quarter term for ever. A real process, real Spark, a real
role without CREATE on the database.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from tests.cli_run import REPO
from tests.fix_pg import PASSWORD, PgServer
from tests.integration.test_cli_config import password_dsn

# About 50 s, most of it Spark's start-up: slow (the fast checks of the same
# guarantee are in test_engine_objects.py).
pytestmark = [pytest.mark.integration, pytest.mark.slow]

APP = """
from pyspark.sql import types as T


def lines(spark, pipeline):
    schema = T.StructType([T.StructField("id", T.LongType()), T.StructField("qty", T.LongType())])
    return spark.readStream.schema(schema).json({inbox!r}), None
"""

CONFIG = """
[store]
root = "expected"

[pipelines.orders.sinks.lines]
dsn = "{dsn}"
password_env = "RUN_PG_PASSWORD"
table = "order_lines"
keys = ["id"]

[pipelines.orders.run]
app = "lease_test_app:lines"
checkpoint = "state/checkpoint"
lease_dsn = "{lease}"
lease_term_s = 2
master = "local[1]"
"""


@pytest.mark.spark  # in a subprocess
def test_a_lease_the_role_may_not_create_ends_reconcile_run_with_exit_2(
    pg_server: PgServer, pg_db: str, tmp_path: Path
) -> None:
    role = f"nocreate_{uuid.uuid4().hex[:8]}"
    db = conninfo_to_dict(pg_db)["dbname"]
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN".encode())  # CONNECT only (PUBLIC's default)
        conn.execute(b"CREATE TABLE order_lines (id bigint PRIMARY KEY, qty bigint, _epoch bigint)")
    (tmp_path / "inbox").mkdir()
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "lease_test_app.py").write_text(APP.format(inbox=str(tmp_path / "inbox")))
    lease = pg_server.dsn(str(db), user=role)
    config = tmp_path / "reconcile.toml"
    config.write_text(CONFIG.format(dsn=password_dsn(pg_db), lease=lease))
    config.chmod(0o600)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), str(tmp_path / "app")]),
        "PYSPARK_PYTHON": sys.executable,
        "RUN_PG_PASSWORD": PASSWORD,
    }
    cmd = [sys.executable, "-m", "reconcile.cli", "run", "--config", str(config),
           "--pipeline", "orders"]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    try:
        # Bounded: Spark's start-up, then the first try for the lease ends it.
        out, err = proc.communicate(timeout=180)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the JVM too, if it is still there
        proc.wait()
    said = err.strip().splitlines()[-1] if err.strip() else ""
    assert proc.returncode == 2, err[-3000:]
    assert said.startswith("reconcile: error: lease of pipeline 'orders'"), said
    assert "cannot create reconcile.reconcile_leases" in said
    assert f"CREATE SCHEMA reconcile AUTHORIZATION {role}" in said
    assert PASSWORD not in err + out
    with psycopg.connect(pg_db) as conn:
        assert conn.execute("SELECT to_regnamespace('reconcile')").fetchone() == (None,)
