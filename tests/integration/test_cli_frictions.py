"""What verify, repair and watch say, where it was easy to misread.

- scoped mode's "no drift" is said "in scope", with the scope it checked and
  a pointer to full mode (65 hand-damaged rows are outside it);
- the foreign writes are counted over every differing row, and by
  transaction, not only over the ten rows traced;
- a refused repair of a config's table is said once, not on stdout and again
  on stderr;
- ``reconcile verify ... | head`` ends quietly when the reader goes away.

Real Postgres, real store; the command line as a process where the output's
streams are the point.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from reconcile import recover
from reconcile.cli.recover import summary
from reconcile.cli.watch import TableOutcome
from tests.cli_run import REPO, cli
from tests.recovery_setup import SIMPLE_DDL, SIMPLE_SCHEMA, Setup, make_setup

pytestmark = pytest.mark.integration


@pytest.fixture
def orders(pg_db: str, tmp_path: Path) -> Setup:
    setup = make_setup(pg_db, str(tmp_path), "orders", SIMPLE_SCHEMA, SIMPLE_DDL, ["id"])
    setup.write([{"id": i, "name": f"n{i}", "total": i} for i in range(400)])
    setup.write([{"id": i, "name": f"m{i}", "total": -i} for i in range(10)])
    return setup


def _args(setup: Setup, command: str, *extra: str) -> list[str]:
    return [command, "--pg", setup.dsn, "--store", setup.root, "--pipeline", "shop",
            "--table", "orders", *extra]  # fmt: skip


def test_scoped_mode_says_what_it_checked_and_that_the_rest_was_not(orders: Setup) -> None:
    # 65 rows damaged by hand, none of them among the keys the last epoch changed.
    assert orders.execute("UPDATE {t} SET total = 0 WHERE id >= 100 AND id < 165") == 65
    scoped = recover(orders.dsn, orders.root, "shop", "orders", mode="scoped", dry_run=True)
    assert not scoped.drift
    told = summary(scoped, repair=False)
    assert "no drift in scope" in told.splitlines()[0]
    assert "scope: the 0 keys the store changed after epoch 1" in told
    assert "drift elsewhere in the table is not looked at (--mode full" in told
    full = recover(orders.dsn, orders.root, "shop", "orders", mode="full", dry_run=True)
    assert full.changed == 65 and full.scope == ""
    assert "in scope" not in summary(full, repair=False)
    out = cli(*_args(orders, "verify", "--mode", "scoped", "--json"))
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["scope"].startswith("the 0 keys the store changed")


def test_the_foreign_writes_are_counted_over_every_differing_row(orders: Setup) -> None:
    # 45 rows changed by hand in three transactions; 10 traced (the default).
    for first in (200, 215, 230):
        orders.execute("UPDATE {t} SET total = 0 WHERE id >= %s AND id < %s", first, first + 15)
    report = recover(orders.dsn, orders.root, "shop", "orders", mode="full", dry_run=True)
    assert report.changed == 45 and len(report.provenance) == 10
    assert (report.foreign_writes, report.foreign_rows, report.foreign_transactions) == (
        10, 45, 3)  # fmt: skip
    assert "foreign writes: 45 of the 45 changed and extra rows, by 3 transaction(s)" in summary(
        report, repair=False
    )
    line = TableOutcome("shop", "orders", "orders", report=report).line()
    assert "45 rows written by 3 foreign transactions" in line and "10 foreign" not in line
    # The engine's own differing rows are not foreign: a store epoch the sink lacks.
    orders.record([{"id": i, "name": "x", "total": 1} for i in range(300, 305)])
    more = recover(orders.dsn, orders.root, "shop", "orders", mode="full", dry_run=True)
    assert (more.changed, more.foreign_rows, more.foreign_transactions) == (50, 45, 3)


def test_a_refused_repair_of_a_config_s_table_is_said_once(orders: Setup, tmp_path: Path) -> None:
    assert orders.execute("UPDATE {t} SET total = 0 WHERE id >= 100 AND id < 200") == 100
    config = tmp_path / "reconcile.toml"
    config.write_text(
        f'[store]\nroot = "{orders.root}"\n\n[pipelines.shop.sinks.orders]\n'
        f'dsn = "{orders.dsn}"\ntable = "orders"\nkeys = ["id"]\n'
    )
    said = "refused by the mass-change brake"
    text = cli("repair", "--config", str(config), "--all")
    assert text.returncode == 2
    assert (text.stdout + text.stderr).count(said) == 1, (text.stdout, text.stderr)
    as_json = cli("repair", "--config", str(config), "--all", "--json")
    assert as_json.returncode == 2
    assert json.loads(as_json.stdout)["tables"][0]["refused"] == "mass_change"
    assert as_json.stderr.count(said) == 1 and as_json.stderr.count("\n") == 1


def test_verify_into_a_closed_pipe_ends_quietly(orders: Setup) -> None:
    """``verify ... | head``: the reader has gone before the report is written."""
    orders.execute("UPDATE {t} SET total = 0 WHERE id < 50")
    proc = subprocess.Popen(
        [sys.executable, "-m", "reconcile.cli", *_args(orders, "verify", "--mode", "full")],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # as `head` exits: every write to the pipe fails with EPIPE
    stderr = proc.stderr.read()
    assert proc.wait(timeout=120) == 141, stderr
    assert stderr == ""  # no error line, no traceback, no "Exception ignored"
    with psycopg.connect(orders.dsn) as conn:  # a verify: nothing was written
        assert conn.execute("SELECT count(*) FROM orders WHERE total = 0").fetchone() == (50,)
