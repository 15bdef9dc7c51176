"""``reconcile verify|repair --config FILE`` and ``reconcile watch``, as real processes.

A pipeline writes two sink tables through a commit cycle with an expected
state (sink names that differ from their tables, one table in a schema of its
own, a password that only the environment knows); rows are then changed by
hand, and the commands are checked against what PostgreSQL holds afterwards.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from reconcile import CommitCycle, CommitSucceeded
from reconcile.engine.expected import ExpectedState
from sinks.postgres.factory import postgres_sink
from tests.cli_run import cli
from tests.fix_pg import PASSWORD, PASSWORD_USER

pytestmark = pytest.mark.integration

EPOCHS = 12


def password_dsn(dsn: str) -> str:
    """The database's DSN as the role that must authenticate, without its password."""
    params = conninfo_to_dict(dsn)
    params.update(user=PASSWORD_USER, host="127.0.0.1")
    params.pop("password", None)
    return make_conninfo(**params)


@pytest.fixture
def pipeline(pg_db: str, tmp_path: Path) -> dict[str, Any]:
    """Epochs 0..EPOCHS-1 written into ``shop.order_lines`` (sink ``lines``) and ``totals``."""
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA shop")
        conn.execute(
            "CREATE TABLE shop.order_lines (id bigint PRIMARY KEY, qty int, _epoch bigint)"
        )
        conn.execute("CREATE TABLE totals (customer int PRIMARY KEY, qty bigint, _epoch bigint)")
    writer = password_dsn(pg_db) + f" password={PASSWORD}"  # the role the commands use
    store = str(tmp_path / "expected")
    expected = ExpectedState(store, "orders", {"lines": ["id"], "totals": ["customer"]})
    cycle = CommitCycle(
        "orders",
        [
            postgres_sink(writer, "order_lines", schema="shop", name="lines"),
            postgres_sink(writer, "totals", name="totals"),
        ],
        expected_state=expected,
    )
    cycle.start()
    totals: dict[int, int] = {}
    for epoch in range(EPOCHS):
        lines = [{"id": epoch * 10 + i, "qty": i + epoch} for i in range(10)]
        for row in lines:
            totals[row["id"] % 3] = totals.get(row["id"] % 3, 0) + row["qty"]
        result = cycle.run_epoch(
            epoch,
            {"lines": lines, "totals": [{"customer": c, "qty": q} for c, q in totals.items()]},
        )
        assert isinstance(result, CommitSucceeded)
    cycle.close()
    config = tmp_path / "reconcile.toml"
    config.write_text(
        f"""
[store]
root = "expected"

[metrics]
textfile = "metrics.prom"

[pipelines.orders.sinks.lines]
dsn = "{password_dsn(pg_db)}"
password_env = "SHOP_PG_PASSWORD"
table = "shop.order_lines"
keys = ["id"]

[pipelines.orders.sinks.totals]
dsn = "{password_dsn(pg_db)}"
password_env = "SHOP_PG_PASSWORD"
table = "totals"
keys = ["customer"]
mode = "full"
max_change_fraction = 0.5  # 3 rows: one changed row is a third of the table
"""
    )
    return {"dsn": pg_db, "config": str(config), "root": tmp_path}


ENV = {"SHOP_PG_PASSWORD": PASSWORD}


def execute(dsn: str, statement: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(statement)  # type: ignore[arg-type]


def rows(dsn: str, query: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(query).fetchall()  # type: ignore[arg-type]


def test_verify_all_then_repair_all_from_the_config_file(pipeline: dict[str, Any]) -> None:
    dsn, config = pipeline["dsn"], pipeline["config"]
    clean = cli("verify", "--config", config, "--all", "--json", env=ENV)
    assert clean.returncode == 0, clean.stderr
    found = json.loads(clean.stdout)
    assert [(t["sink"], t["missing"], t["extra"], t["changed"]) for t in found["tables"]] == [
        ("lines", 0, 0, 0),
        ("totals", 0, 0, 0),
    ]
    before_lines = rows(dsn, "SELECT id, qty FROM shop.order_lines ORDER BY id")
    before_totals = rows(dsn, "SELECT customer, qty FROM totals ORDER BY customer")
    execute(dsn, "DELETE FROM shop.order_lines WHERE id IN (3, 4)")
    execute(dsn, "UPDATE totals SET qty = qty + 1 WHERE customer = 2")
    drift = cli("verify", "--config", config, "--all", "--json", env=ENV)
    assert drift.returncode == 1, drift.stderr
    by_sink = {t["sink"]: t for t in json.loads(drift.stdout)["tables"]}
    assert (by_sink["lines"]["missing"], by_sink["lines"]["changed"]) == (2, 0)
    assert (by_sink["totals"]["changed"], by_sink["totals"]["mode"]) == (1, "full")
    assert PASSWORD not in drift.stdout + drift.stderr
    one = cli("repair", "--config", config, "--pipeline", "orders", "--table", "lines", env=ENV)
    assert one.returncode == 1, one.stderr
    assert "orders.lines (shop.order_lines): missing 2" in one.stdout
    assert rows(dsn, "SELECT id, qty FROM shop.order_lines ORDER BY id") == before_lines
    assert (
        rows(dsn, "SELECT customer, qty FROM totals ORDER BY customer") != before_totals
    )  # not touched
    assert cli("repair", "--config", config, "--all", env=ENV).returncode == 1
    assert rows(dsn, "SELECT customer, qty FROM totals ORDER BY customer") == before_totals
    assert cli("verify", "--config", config, "--all", env=ENV).returncode == 0


def test_one_table_failing_is_reported_and_the_others_still_checked(
    pipeline: dict[str, Any],
) -> None:
    dsn, config = pipeline["dsn"], pipeline["config"]
    execute(dsn, "UPDATE shop.order_lines SET qty = -1 WHERE id = 5")
    execute(dsn, "ALTER TABLE totals RENAME TO totals_gone")
    result = cli("verify", "--config", config, "--all", env=ENV)
    assert result.returncode == 2, result.stderr  # an error wins over drift
    lines = result.stdout.splitlines()
    assert lines[0].startswith("orders.lines (shop.order_lines): missing 0, extra 0, changed 1")
    assert lines[1].startswith("orders.totals (totals): error:") and "totals" in lines[1]
    wrong = cli("verify", "--config", config, "--all", env={"SHOP_PG_PASSWORD": "not-it"})
    assert wrong.returncode == 2
    assert "not-it" not in wrong.stdout + wrong.stderr and "error" in wrong.stdout
    unnamed = cli("verify", "--config", config, env=ENV)  # neither --all nor --pipeline
    assert unnamed.returncode == 2 and "--all" in unnamed.stderr


def test_watch_repairs_drift_in_the_recent_epochs_and_exports_it(
    pipeline: dict[str, Any],
) -> None:
    dsn, config = pipeline["dsn"], pipeline["config"]
    recent = (EPOCHS - 1) * 10 + 5  # a row the newest epoch wrote
    old = 5  # a row of epoch 0
    execute(dsn, f"UPDATE shop.order_lines SET qty = -1 WHERE id IN ({recent}, {old})")
    watched = cli(
        "watch", "--config", config, "--pipeline", "orders", "--every", "1s", "--count", "2",
        "--epochs", "3", "--repair", "--json", env=ENV,
    )  # fmt: skip
    assert watched.returncode == 0, watched.stderr  # the last round found nothing
    rounds = [json.loads(line) for line in watched.stdout.splitlines()]
    assert [r["round"] for r in rounds] == [1, 2]
    first = {t["sink"]: t for t in rounds[0]["tables"]}
    assert first["lines"]["mode"] == "scoped" and first["lines"]["changed"] == 1
    assert first["lines"]["applied"] == 1 and rounds[0]["exit_code"] == 1
    assert all(t["changed"] == 0 for t in rounds[1]["tables"])
    qty = dict(rows(dsn, f"SELECT id, qty FROM shop.order_lines WHERE id IN ({recent}, {old})"))
    # Scoped to the newest 3 epochs: the recent row is repaired; the old one is
    # outside the scope (a full or buckets check finds it).
    assert qty == {recent: 5 + EPOCHS - 1, old: -1}
    assert cli("verify", "--config", config, "--all", "--mode", "buckets", env=ENV).returncode == 1
    exported = (pipeline["root"] / "metrics.prom").read_text()
    assert 'reconcile_drift_repaired_rows_total{pipeline="orders",table=' in exported


def test_watch_checks_exactly_the_keys_of_the_newest_n_epochs(pipeline: dict[str, Any]) -> None:
    # With 12 epochs, --epochs 3 covers epochs 9, 10 and 11: a row of epoch 9
    # is inside, a row of epoch 8 just outside; --epochs 4 takes both.
    from reconcile.cli.config import load_config
    from reconcile.cli.watch import check_table

    dsn, config = pipeline["dsn"], pipeline["config"]
    execute(dsn, "UPDATE shop.order_lines SET qty = -1 WHERE id IN (85, 95)")  # epochs 8, 9
    lines = load_config(config, env=ENV).pipeline("orders").sink("lines")
    for epochs, changed in ((3, 1), (4, 2), (EPOCHS + 5, 2)):
        outcome = check_table(lines, repair=False, mode="scoped", recent_epochs=epochs)
        assert outcome.report is not None, outcome.error
        assert outcome.report.changed == changed, epochs


@pytest.mark.spark
@pytest.mark.timeout(600)  # the CLI starts Spark in its subprocess
def test_config_with_spark_runs_each_table_on_spark(pipeline: dict[str, Any]) -> None:
    dsn, config = pipeline["dsn"], pipeline["config"]
    before_lines = rows(dsn, "SELECT id, qty FROM shop.order_lines ORDER BY id")
    before_totals = rows(dsn, "SELECT customer, qty FROM totals ORDER BY customer")
    execute(dsn, "DELETE FROM shop.order_lines WHERE id IN (3, 4)")
    execute(dsn, "UPDATE totals SET qty = qty + 1 WHERE customer = 2")
    spark = ["--spark", "--master", "local[2]", "--partitions", "2"]
    repaired = cli("repair", "--config", config, "--all", *spark, "--json", env=ENV)
    assert repaired.returncode == 1, repaired.stderr
    by_sink = {t["sink"]: t for t in json.loads(repaired.stdout)["tables"]}
    # Fields only the Spark job reports: the key ranges the executors pulled,
    # and the repair transactions they committed.
    assert (by_sink["lines"]["partitions"], by_sink["lines"]["missing"]) == (2, 2)
    assert by_sink["lines"]["transactions"] >= 1 and by_sink["lines"]["applied"] == 2
    assert (by_sink["totals"]["changed"], by_sink["totals"]["applied"]) == (1, 1)
    assert all(t["mode"] == "full" and "error" not in t for t in by_sink.values())
    assert rows(dsn, "SELECT id, qty FROM shop.order_lines ORDER BY id") == before_lines
    assert rows(dsn, "SELECT customer, qty FROM totals ORDER BY customer") == before_totals
    assert PASSWORD not in repaired.stdout + repaired.stderr


def test_flags_that_a_form_of_the_command_would_ignore_are_refused(
    pipeline: dict[str, Any],
) -> None:
    dsn, config = pipeline["dsn"], pipeline["config"]
    execute(dsn, "DELETE FROM shop.order_lines WHERE id = 3")
    before = rows(dsn, "SELECT id, qty FROM shop.order_lines ORDER BY id")
    # What Spark cannot do is refused before a session starts, never dropped.
    scoped = cli("repair", "--config", config, "--all", "--spark", "--mode", "scoped", env=ENV)
    assert scoped.returncode == 2 and "--spark runs full mode" in scoped.stderr
    alone = cli("repair", "--config", config, "--all", "--partitions", "2", env=ENV)
    assert alone.returncode == 2 and "add --spark" in alone.stderr
    both = cli("repair", "--config", config, "--all", "--pg", dsn, "--epoch", "3", env=ENV)
    assert both.returncode == 2 and "drop --pg, --epoch" in both.stderr
    stray = cli("repair", "--pg", dsn, "--store", str(pipeline["root"] / "expected"),
                "--pipeline", "orders", "--table", "totals", "--all", env=ENV)  # fmt: skip
    assert stray.returncode == 2 and "--all selects every table of a config file" in stray.stderr
    assert rows(dsn, "SELECT id, qty FROM shop.order_lines ORDER BY id") == before  # not repaired
