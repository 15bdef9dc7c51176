"""``reconcile verify|repair|watch --config FILE`` on a MariaDB table, as real processes.

A pipeline writes a table through the SQL sink (``mariadb+pymysql://``) with an
expected state; rows are changed by hand; the commands, reading the table from
the config file (the password from the environment only), find and undo it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from reconcile import CommitCycle, CommitSucceeded
from reconcile.engine.expected import ExpectedState
from sinks.sql.sink import SqlSink
from tests.cli_run import cli
from tests.mariadb_server import PASSWORD, PASSWORD_USER, MariadbServer

pytestmark = pytest.mark.integration

EPOCHS = 6
ENV = {"SHOP_DB_PASSWORD": PASSWORD}


@pytest.fixture
def pipeline(mariadb_server: MariadbServer, tmp_path: Path) -> Any:
    db = mariadb_server.create_database("cli")
    with mariadb_server.connect(db) as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE order_lines (id BIGINT PRIMARY KEY, qty INT, _epoch BIGINT)")
    url = mariadb_server.url(db, password=True)
    expected = ExpectedState(str(tmp_path / "expected"), "orders", {"lines": ["id"]})
    cycle = CommitCycle(
        "orders", [SqlSink(url, "order_lines", name="lines")], expected_state=expected
    )
    cycle.start()
    for epoch in range(EPOCHS):
        lines = [{"id": epoch * 10 + i, "qty": i + epoch} for i in range(10)]
        assert isinstance(cycle.run_epoch(epoch, {"lines": lines}), CommitSucceeded)
    cycle.close()
    config = tmp_path / "reconcile.toml"
    config.write_text(
        f"""
[store]
root = "expected"

[pipelines.orders.sinks.lines]
url = "mariadb+pymysql://{PASSWORD_USER}@127.0.0.1:{mariadb_server.port}/{db}"
password_env = "SHOP_DB_PASSWORD"
table = "order_lines"
keys = ["id"]
"""
    )
    yield mariadb_server, db, str(config)
    mariadb_server.drop_database(db)


def execute(server: MariadbServer, db: str, statement: str) -> list[tuple[Any, ...]]:
    with server.connect(db) as conn, conn.cursor() as cur:
        cur.execute(statement)
        return list(cur.fetchall())


def test_verify_repair_and_watch_from_the_config_file(pipeline: Any) -> None:
    server, db, config = pipeline
    clean = cli("verify", "--config", config, "--all", "--json", env=ENV)
    assert clean.returncode == 0, clean.stderr
    assert [(t["missing"], t["extra"], t["changed"]) for t in json.loads(clean.stdout)["tables"]
            ] == [(0, 0, 0)]  # fmt: skip
    before = execute(server, db, "SELECT id, qty FROM order_lines ORDER BY id")
    execute(server, db, "DELETE FROM order_lines WHERE id IN (3, 4)")
    execute(server, db, "UPDATE order_lines SET qty = -1 WHERE id = 55")  # the newest epoch
    execute(server, db, "INSERT INTO order_lines VALUES (999, 1, NULL)")
    drift = cli("verify", "--config", config, "--all", "--json", env=ENV)
    assert drift.returncode == 1, drift.stderr
    (found,) = json.loads(drift.stdout)["tables"]
    assert (found["missing"], found["extra"], found["changed"]) == (2, 1, 1)
    # watch --repair, scoped to the newest epochs: the changed row of epoch 5 only.
    watched = cli("watch", "--config", config, "--pipeline", "orders", "--every", "1s",
                  "--count", "1", "--epochs", "2", "--repair", "--json", env=ENV)  # fmt: skip
    assert watched.returncode == 1, watched.stderr
    (round_,) = [json.loads(line) for line in watched.stdout.splitlines()]
    assert (round_["tables"][0]["changed"], round_["tables"][0]["applied"]) == (1, 1)
    repaired = cli("repair", "--config", config, "--all", env=ENV)
    assert repaired.returncode == 1, repaired.stderr
    assert "missing 2, extra 1" in repaired.stdout
    assert execute(server, db, "SELECT id, qty FROM order_lines ORDER BY id") == before
    assert cli("verify", "--config", config, "--all", env=ENV).returncode == 0
    for run in (clean, drift, watched, repaired):
        assert PASSWORD not in run.stdout + run.stderr
    wrong = cli("verify", "--config", config, "--all", env={"SHOP_DB_PASSWORD": "not-it"})
    assert wrong.returncode == 2 and "error" in wrong.stdout
    assert "not-it" not in wrong.stdout + wrong.stderr
