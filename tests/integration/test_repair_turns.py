"""Repairs of one table take turns: a second repair waits, then finds what the first left.

Two repairs started together used to pull the same drift and each apply all
of it, each reporting the whole difference and each recording it in
``reconcile_repairs``. Here two repairs run at once, as threads of one process
and as two ``reconcile repair`` processes, on a real PostgreSQL server: the
table ends exact, one repair applies the difference, the other waits for it
(seen waiting in ``pg_locks``), finds no drift and says that it waited; the
audit table holds one repair. The same through SQLAlchemy, on PostgreSQL and
on MariaDB (the generic SQL sink's turn).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

from expected_state.store import ExpectedStateStore
from reconcile import CommitCycle, CommitSucceeded, recover
from reconcile.cli.recover import summary
from reconcile.core import hooks
from reconcile.core.contract import Change
from reconcile.recovery.engine import PULLED
from reconcile.recovery.report import ReconcileReport
from sinks.postgres.repair_turn import turn_key
from sinks.sql.sink import SqlSink
from tests.fix_pg import PgServer
from tests.mariadb_server import MariadbServer
from tests.recovery_setup import (
    SIMPLE_DDL,
    SIMPLE_SCHEMA,
    Setup,
    expected_rows,
    make_setup,
    read_connection,
    sink_rows,
)

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
MISSING, CHANGED = 300, 40  # deleted and changed by hand (within the brake: 40 of 1,700)


@pytest.fixture
def drifted(pg_db: str, tmp_path: Path) -> Setup:
    setup = make_setup(pg_db, str(tmp_path), "orders", SIMPLE_SCHEMA, SIMPLE_DDL, ["id"])
    setup.write([{"id": i, "name": f"n{i}", "total": i} for i in range(2000)])
    assert setup.execute("DELETE FROM {t} WHERE id < %s", MISSING) == MISSING
    assert setup.execute("UPDATE {t} SET total = -1 WHERE id >= 1900 AND id < %s",
                         1900 + CHANGED) == CHANGED  # fmt: skip
    return setup


def _turn_waiters(dsn: str) -> list[int]:
    """The backends waiting for an advisory lock (a repair's turn), as pg_locks shows them."""
    with read_connection(dsn) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
        ).fetchall()
    return [int(r[0]) for r in rows]


def _turn_holders(dsn: str) -> list[int]:
    with read_connection(dsn) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted"
        ).fetchall()
    return [int(r[0]) for r in rows]


def _wait_until(check: Any, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _audit(setup: Setup) -> list[tuple[Any, ...]]:
    """The repairs recorded in the sink's audit table: (missing, changed, applied) each."""
    with read_connection(setup.dsn) as conn:
        return conn.execute(
            "SELECT missing, changed, applied FROM reconcile.reconcile_repairs ORDER BY xid"
        ).fetchall()


def test_a_second_repair_waits_for_the_first_then_finds_nothing(drifted: Setup) -> None:
    reports: dict[str, ReconcileReport] = {}
    holders: list[int] = []

    def second() -> None:
        reports["second"] = recover(drifted.dsn, drifted.root, "shop", "orders", mode="full")

    other = threading.Thread(target=second)

    def start_the_second_while_the_first_holds_the_table() -> None:
        # The first has pulled and diffed; it writes nothing until this returns.
        holders.extend(_turn_holders(drifted.dsn))
        other.start()
        _wait_until(lambda: _turn_waiters(drifted.dsn), "the second repair to wait", 20.0)

    with hooks.at(PULLED, start_the_second_while_the_first_holds_the_table) as arming:
        first = recover(drifted.dsn, drifted.root, "shop", "orders", mode="full")
    other.join(120)
    assert arming.fired == 1 and not other.is_alive()
    assert (first.missing, first.changed, first.applied) == (MISSING, CHANGED, MISSING + CHANGED)
    assert first.repair_wait_s == 0.0
    late = reports["second"]
    assert (late.missing, late.extra, late.changed, late.applied) == (0, 0, 0, 0)
    assert late.repair_wait_s > 0
    (holder,) = holders
    assert late.repair_waited_for.startswith(f"backend pid {holder} (")
    told = summary(late, repair=True)
    assert f"waited {late.repair_wait_s:.2f}s for another repair of this table" in told
    assert "no drift" in told and "nothing to write" in told
    assert _audit(drifted) == [(MISSING, CHANGED, MISSING + CHANGED)]
    assert sink_rows(drifted) == expected_rows(drifted)


def test_two_repair_processes_at_once_repair_the_table_once(drifted: Setup) -> None:
    """Two ``reconcile repair`` processes, let go together: one repairs, one finds nothing."""
    args = [sys.executable, "-m", "reconcile.cli", "repair", "--pg", drifted.dsn]
    args += ["--store", drifted.root, "--pipeline", "shop", "--table", "orders"]
    args += ["--mode", "full", "--json"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with psycopg.connect(drifted.dsn, autocommit=True) as gate:
        # The test holds the table's turn, so that both processes are waiting
        # for it before either pulls: then it lets go, and they race.
        key = turn_key(gate, "public", "orders")
        gate.execute("SELECT pg_advisory_lock(%s)", (key,))
        procs = [
            subprocess.Popen(
                args, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
            for _ in range(2)
        ]
        try:
            _wait_until(lambda: len(_turn_waiters(drifted.dsn)) == 2, "both repairs to wait")
            gate.execute("SELECT pg_advisory_unlock(%s)", (key,))
            outs = [p.communicate(timeout=240) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
    codes = sorted(p.returncode for p in procs)
    assert codes == [0, 1], outs  # one found nothing, one found drift and repaired it
    found = sorted((json.loads(out) for out, _ in outs), key=lambda r: r["applied"])
    assert [(r["missing"], r["changed"], r["applied"]) for r in found] == [
        (0, 0, 0), (MISSING, CHANGED, MISSING + CHANGED)]  # fmt: skip
    # Each waited: for the test, and one of them for the other too.
    assert all(r["repair_wait_s"] > 0 for r in found)
    assert _audit(drifted) == [(MISSING, CHANGED, MISSING + CHANGED)]
    assert sink_rows(drifted) == expected_rows(drifted)


def test_a_verify_takes_no_turn(drifted: Setup) -> None:
    """A verify writes nothing: it reads while a repair holds the table."""
    with psycopg.connect(drifted.dsn, autocommit=True) as gate:
        gate.execute("SELECT pg_advisory_lock(%s)", (turn_key(gate, "public", "orders"),))
        report = recover(drifted.dsn, drifted.root, "shop", "orders", mode="full", dry_run=True)
    assert (report.missing, report.changed, report.repair_wait_s) == (MISSING, CHANGED, 0.0)


SQL_DDL = (
    "CREATE TABLE orders (id BIGINT PRIMARY KEY, name VARCHAR(40), total BIGINT, _epoch BIGINT)"
)


@pytest.fixture(params=["postgres", "mariadb"])
def sql_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """A database reached through SQLAlchemy (the generic SQL sink), with the table."""
    if request.param == "mariadb":
        maria: MariadbServer = request.getfixturevalue("mariadb_server")
        db = maria.create_database("turns")
        with maria.connect(db) as conn, conn.cursor() as cur:
            cur.execute(SQL_DDL)
        yield maria.url(db)
        maria.drop_database(db)
        return
    server: PgServer = request.getfixturevalue("pg_server")
    db = server.create_database("turns")
    with server.connect(db) as conn:
        conn.execute(SQL_DDL)
    yield f"postgresql+psycopg://postgres@127.0.0.1:{server.port}/{db}"
    server.drop_database(db)


def _sql_waiting(url: str) -> bool:
    """Whether a session waits for a repair's turn, as the server's own views say."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            if engine.dialect.name == "postgresql":
                query = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            else:
                query = (
                    "SELECT count(*) FROM information_schema.processlist "
                    "WHERE info LIKE 'SELECT GET_LOCK(%%' AND state = 'User lock'"
                )
            return bool(conn.exec_driver_sql(query).scalar())
    finally:
        engine.dispose()


def test_repairs_through_sqlalchemy_take_turns(sql_url: str, tmp_path: Path) -> None:
    """MariaDB's GET_LOCK, PostgreSQL's advisory lock: the second repair finds nothing."""
    root = str(tmp_path)
    rows = [{"id": i, "name": f"n{i}", "total": i} for i in range(400)]
    ExpectedStateStore(root, "shop", "orders", ["id"], schema=SIMPLE_SCHEMA).apply(
        0, [Change("upsert", r) for r in rows]
    )
    cycle = CommitCycle("shop", [SqlSink(sql_url, "orders", name="orders")], tmp_path / "log")
    try:
        cycle.start()
        assert isinstance(cycle.run_epoch(0, {"orders": rows}), CommitSucceeded)
    finally:
        cycle.close()
    engine = sa.create_engine(sql_url)
    with engine.begin() as conn:
        conn.exec_driver_sql("DELETE FROM orders WHERE id < 100")
    reports: dict[str, ReconcileReport] = {}

    def second() -> None:
        reports["second"] = recover(sql_url, root, "shop", "orders", mode="full", fast_path=False)

    other = threading.Thread(target=second)

    def start_the_second() -> None:
        other.start()
        _wait_until(lambda: _sql_waiting(sql_url), "the second repair to wait", 20.0)

    with hooks.at(PULLED, start_the_second) as arming:
        first = recover(sql_url, root, "shop", "orders", mode="full", fast_path=False)
    other.join(120)
    assert arming.fired == 1 and not other.is_alive()
    late = reports["second"]
    assert (first.missing, first.applied) == (100, 100)
    assert (late.missing, late.extra, late.changed, late.applied) == (0, 0, 0, 0)
    assert late.repair_wait_s > 0 and late.repair_waited_for.startswith("session ")
    with engine.connect() as conn:
        audit = conn.exec_driver_sql("SELECT missing, applied FROM reconcile_sql_repairs").all()
        count = conn.exec_driver_sql("SELECT count(*) FROM orders").scalar()
    engine.dispose()
    assert [tuple(a) for a in audit] == [(100, 100)] and count == 400
