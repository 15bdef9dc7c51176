"""A pipeline built from a config file writes into Postgres; its JSON log lines carry the fields.

The sink's commit line names pipeline, epoch, sink, txn and the xid that the
marker row recorded in the database; the password (from the environment, as
the config file says) appears in no line.
"""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path
from typing import Any

import psycopg
import pytest

from reconcile import CommitCycle, CommitSucceeded
from reconcile.cli.config import load_config
from reconcile.core.logs import configure
from sinks.postgres.factory import postgres_sink
from tests.fix_pg import PASSWORD, PASSWORD_USER, PgServer

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("mode", ["transactional", "prepared"])
def test_json_lines_of_a_configured_pipeline(
    pg_server: PgServer, tmp_path: Path, mode: str
) -> None:
    db = pg_server.create_database()
    with pg_server.connect(db) as conn:
        conn.execute("CREATE TABLE orders (id int PRIMARY KEY, amount int)")
    config_file = tmp_path / "reconcile.toml"
    config_file.write_text(
        f"""
        [store]
        root = "expected"

        [logs]
        json = true

        [pipelines.shop.sinks.orders]
        dsn = "host=127.0.0.1 port={pg_server.port} dbname={db} user={PASSWORD_USER}"
        password_env = "SHOP_PG_PASSWORD"
        table = "orders"
        keys = ["id"]
        write_mode = "{mode}"
        """.replace("\n        ", "\n")
    )
    config = load_config(config_file, env={"SHOP_PG_PASSWORD": PASSWORD})
    table = next(config.tables())
    stream = io.StringIO()
    handler = configure(json=config.logs.json, level=config.logs.level, stream=stream)
    try:
        sink = postgres_sink(
            table.connection.get_secret_value(), table.table, mode=table.write_mode, name=table.name
        )
        cycle = CommitCycle(table.pipeline, [sink], tmp_path / "progress")
        cycle.start()
        rows = [{"id": i, "amount": i} for i in range(3)]
        assert cycle.run_epoch(0, {"orders": rows}) == CommitSucceeded(0)
        cycle.close()
    finally:
        logging.getLogger().removeHandler(handler)
    text = stream.getvalue()
    assert PASSWORD not in text and "Pa55" not in text
    lines: list[dict[str, Any]] = [json.loads(line) for line in text.splitlines()]
    with psycopg.connect(pg_server.dsn(db)) as conn:
        marker = conn.execute("SELECT xid::text FROM reconcile.reconcile_commits").fetchone()
    assert marker is not None
    epoch_line = next(r for r in lines if "epoch 0 committed" in r["message"])
    assert (epoch_line["pipeline"], epoch_line["epoch"]) == ("shop", 0)
    commit_line = next(
        r
        for r in lines
        if r["logger"] == "reconcile.sinks.postgres" and "committed" in r["message"]
    )
    assert commit_line["pipeline"] == "shop" and commit_line["epoch"] == 0
    assert commit_line["sink"] == "orders" and commit_line["txn"] == "shop-orders-0-g1"
    assert commit_line["xid"] == marker[0]
