"""Every engine session pins what it depends on: a database's hostile defaults change nothing.

A database whose defaults (``ALTER DATABASE ... SET``) say DateStyle ``SQL,
DMY``, a verbose IntervalStyle, a TimeZone far from UTC, rounded floats,
escaped bytea and backslash escapes in literals: the commit cycle, verify,
repair and ``reconcile status`` run there exactly as they do on a default
database, because every connection the engine opens sets its own values in
its startup packet (``sinks.postgres.connection.SESSION_SETTINGS``).
"""

from __future__ import annotations

import ast
import datetime as dt
import json
import random
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from reconcile import CommitCycle, drive, recover
from reconcile.cli import main
from reconcile.engine.driver import RetryPolicy
from reconcile.engine.expected import ExpectedState
from sinks.postgres.connection import SESSION_SETTINGS, PgTarget
from sinks.postgres.factory import postgres_sink
from sinks.sql.sink import SqlSink
from tests.fix_pg import PgServer
from tests.recovery_setup import (
    TYPES_DDL,
    TYPES_KEYS,
    TYPES_SCHEMA,
    expected_rows,
    make_setup,
    read_connection,
    sink_rows,
    types_row,
)

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]

HOSTILE = {
    "DateStyle": "SQL, DMY",
    "IntervalStyle": "postgres_verbose",
    "TimeZone": "Pacific/Chatham",
    "extra_float_digits": "-15",
    "bytea_output": "escape",
    "standard_conforming_strings": "off",
}


@pytest.fixture
def hostile_db(pg_server: PgServer) -> str:
    """A fresh database whose defaults are all the hostile settings above."""
    return pg_server.dsn(pg_server.database_with_defaults("hostile", HOSTILE))


@pytest.fixture
def hostile_role(pg_server: PgServer) -> str:
    """A fresh database and a role of its own whose defaults (ALTER ROLE ... SET) are hostile."""
    name = pg_server.create_database("hostile_role")
    role = f"{name}_writer"
    with psycopg.connect(pg_server.dsn(), autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN SUPERUSER").format(sql.Identifier(role)))
        for setting, value in HOSTILE.items():
            conn.execute(
                sql.SQL("ALTER ROLE {} SET {} = {}").format(
                    sql.Identifier(role), sql.Identifier(setting), sql.Literal(value)
                )
            )
    dsn = f"{pg_server.dsn(name)} user={role}"
    with psycopg.connect(dsn, autocommit=True) as conn:  # the defaults are in force
        assert conn.execute("SHOW extra_float_digits").fetchone() == ("-15",)
        assert conn.execute("SHOW DateStyle").fetchone() == ("SQL, DMY",)
    return dsn


def test_the_engine_s_sessions_override_the_database_s_defaults(hostile_db: str) -> None:
    with PgTarget.parse(hostile_db).connect(autocommit=True) as conn:
        for setting, value in SESSION_SETTINGS:
            row = conn.execute(sql.SQL("SHOW {}").format(sql.Identifier(setting))).fetchone()
            assert row is not None
            assert str(row[0]).replace(" ", "") == value.replace(" ", ""), setting


def test_a_user_s_own_options_are_kept_and_the_engine_s_win(hostile_db: str) -> None:
    dsn = f"{hostile_db} options='-c application_name=mine -c TimeZone=Asia/Tokyo'"
    with PgTarget.parse(dsn).connect(autocommit=True) as conn:
        assert conn.execute("SHOW application_name").fetchone() == ("mine",)
        assert conn.execute("SHOW TimeZone").fetchone() == ("UTC",)


def test_cycle_verify_and_repair_are_exact_under_hostile_defaults(
    hostile_db: str, tmp_path: Path
) -> None:
    setup = make_setup(hostile_db, str(tmp_path), "ledger", TYPES_SCHEMA, TYPES_DDL, TYPES_KEYS)
    rng = random.Random(11)
    rows = [types_row(rng) for _ in range(60)]
    setup.write(rows[:30])
    setup.write(rows[30:], deletes=[rows[0]])
    assert sink_rows(setup) == expected_rows(setup)
    clean = recover(hostile_db, setup.root, "shop", "ledger", mode="full", dry_run=True)
    assert (clean.missing, clean.extra, clean.changed) == (0, 0, 0)
    # Hand drift in the columns whose text form the settings change.
    k = rows[5]
    setup.execute(
        "UPDATE {t} SET at = '2001-02-03 04:05:06', at_tz = '2001-02-03 04:05:06+00', "
        "day = '2001-02-03', ratio = 0.1, blob = decode('0001', 'hex') "
        "WHERE region = %s AND id = %s",
        k["region"],
        k["id"],
    )
    drift = recover(hostile_db, setup.root, "shop", "ledger", mode="full", dry_run=True)
    assert (drift.missing, drift.extra, drift.changed) == (0, 0, 1)
    repaired = recover(hostile_db, setup.root, "shop", "ledger", mode="full")
    assert repaired.applied == 1
    assert sink_rows(setup) == expected_rows(setup)
    again = recover(hostile_db, setup.root, "shop", "ledger", mode="full", dry_run=True)
    assert (again.missing, again.extra, again.changed, again.applied) == (0, 0, 0, 0)


def test_status_reads_the_database_under_hostile_defaults(
    hostile_db: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    setup = make_setup(hostile_db, str(tmp_path), "ledger", TYPES_SCHEMA, TYPES_DDL, TYPES_KEYS)
    setup.write([types_row(random.Random(3))])
    args = ["status", "--state", setup.state, "--pipeline", "shop", "--pg", hostile_db, "--json"]
    assert main(args) == 0
    (schema,) = json.loads(capsys.readouterr().out)["postgres"]["schemas"]
    assert [(m["sink"], m["markers"]) for m in schema["markers"]] == [("ledger", 1)]


def test_a_pipeline_with_an_expected_state_verify_repair_and_status_under_a_hostile_role(
    hostile_role: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The whole cycle (store, decision, sink), the CLI's verify, repair and status.

    Each once failed under ``DateStyle`` 'SQL, DMY': the pipeline retried its
    first epoch until it gave up, ``status --pg`` ended in a traceback, and a
    repair with drift exited 2.
    """
    with psycopg.connect(hostile_role, autocommit=True) as conn:
        conn.execute(sql.SQL(TYPES_DDL).format(sql.Identifier("ledger")))
    root = str(tmp_path / "store")
    rng = random.Random(5)
    batches = [[types_row(rng) for _ in range(20)] for _ in range(3)]

    def build() -> CommitCycle:
        return CommitCycle(
            "shop",
            [postgres_sink(hostile_role, "ledger", name="ledger")],
            expected_state=ExpectedState(root, "shop", {"ledger": TYPES_KEYS}),
        )

    no_retry = RetryPolicy(give_up_after_s=30.0, initial_s=0.0, max_s=0.0, jitter_s=0.0)
    report = drive(build, range(3), lambda e: {"ledger": batches[e]}, retry=no_retry)
    assert report.committed_epochs == [0, 1, 2]
    assert (report.retries, report.restarts) == (0, 0)
    base = ["--pg", hostile_role, "--store", root, "--pipeline", "shop", "--table", "ledger"]
    assert main(["verify", *base, "--mode", "full"]) == 0
    with read_connection(hostile_role) as conn:
        written = conn.execute("SELECT count(*), sum(ratio) FROM ledger").fetchone()
        wanted = sum(r["ratio"] or 0.0 for b in batches for r in b)
        assert written is not None and written[0] == 60 and written[1] == pytest.approx(wanted)
        victim = batches[1][3]
        conn.execute(
            "UPDATE ledger SET at = '2001-02-03 04:05:06', day = '2001-02-03', ratio = 0.1 "
            "WHERE region = %s AND id = %s",
            (victim["region"], victim["id"]),
        )
    capsys.readouterr()
    assert main(["repair", *base, "--mode", "full", "--json"]) == 1  # drift found and repaired
    repaired = json.loads(capsys.readouterr().out)
    assert (repaired["changed"], repaired["applied"]) == (1, 1)
    with read_connection(hostile_role) as conn:
        row = conn.execute(
            "SELECT at, day, ratio FROM ledger WHERE region = %s AND id = %s",
            (victim["region"], victim["id"]),
        ).fetchone()
    assert row == (victim["at"], victim["day"], victim["ratio"])
    assert main(["verify", *base, "--mode", "full"]) == 0
    assert main(["status", "--store", root, "--pipeline", "shop", "--pg", hostile_role]) == 0
    out = capsys.readouterr().out
    assert "Traceback" not in out and "ledger" in out


SQL_DDL = (
    "CREATE TABLE moments (id bigint PRIMARY KEY, day date, at timestamptz, ratio float8, "
    "blob bytea, _epoch bigint)"
)


def test_the_sql_sink_on_postgres_pins_the_same_settings(hostile_role: str, tmp_path: Path) -> None:
    """SQLAlchemy's sessions to PostgreSQL (the generic SQL sink) pin them too.

    Without them, its pull (psycopg reading a timestamptz as text) fails
    under 'SQL, DMY', and a float8 read back rounded is false drift.
    """
    with psycopg.connect(hostile_role, autocommit=True) as conn:
        conn.execute(SQL_DDL)
    params = PgTarget.parse(hostile_role).params
    url = (
        f"postgresql+psycopg://{params['user']}@{params.get('host', '127.0.0.1')}:"
        f"{params['port']}/{params['dbname']}"
    )
    root = str(tmp_path / "store")
    rows: list[dict[str, Any]] = [
        {"id": i, "day": dt.date(2001, 2, 13 + i), "ratio": 0.1 + i / 3, "blob": b"\\x\0" * i,
         "at": dt.datetime(2001, 2, 3, 4, 5, i, tzinfo=dt.UTC)}
        for i in range(8)
    ]  # fmt: skip
    cycle = CommitCycle(
        "shop",
        [SqlSink(url, "moments", name="moments")],
        expected_state=ExpectedState(root, "shop", {"moments": ["id"]}),
    )
    try:
        cycle.start()
        assert cycle.run_epoch(0, {"moments": rows}).__class__.__name__ == "CommitSucceeded"
    finally:
        cycle.close()
    clean = recover(url, root, "shop", "moments", mode="full", dry_run=True, fast_path=False)
    assert (clean.rows_pulled, clean.missing, clean.extra, clean.changed) == (8, 0, 0, 0)
    with read_connection(hostile_role) as conn:
        conn.execute("UPDATE moments SET ratio = 0.5, at = now() WHERE id = 3")
    repaired = recover(
        url, root, "shop", "moments", mode="full", fast_path=False, allow_mass_change=True
    )
    assert (repaired.changed, repaired.applied) == (1, 1)
    with read_connection(hostile_role) as conn:
        got = conn.execute("SELECT ratio, at FROM moments WHERE id = 3").fetchone()
    assert got == (rows[3]["ratio"], rows[3]["at"])
    again = recover(url, root, "shop", "moments", mode="full", dry_run=True, fast_path=False)
    assert (again.missing, again.extra, again.changed) == (0, 0, 0)


def _from_conninfo(call: ast.Call) -> bool:
    """Whether the call's first argument is ``<something>.conninfo(...)``."""
    first = call.args[0] if call.args else None
    return (
        isinstance(first, ast.Call)
        and isinstance(first.func, ast.Attribute)
        and first.func.attr == "conninfo"
    )


_DRIVERS = ("psycopg", "psycopg2", "adbc", "dbapi", "asyncpg", "pg8000")


def _root_name(node: ast.expr) -> str | None:
    """The name an attribute chain starts from: ``psycopg`` for ``psycopg.Connection.connect``."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _bypasses(node: ast.AST) -> str | None:
    """What in ``node`` opens a PostgreSQL session without the pinned settings, if anything."""
    if isinstance(node, ast.ImportFrom) and node.module:
        base = node.module.split(".")[0]
        if base in ("psycopg_pool", "psycopg2") or (
            base == "psycopg" and {a.name for a in node.names} & {"connect", "AsyncConnection"}
        ):
            return f"from {node.module} import ..."
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.name.split(".")[0] in ("psycopg_pool", "psycopg2", "asyncpg", "pg8000"):
                return f"import {alias.name}"
    if not isinstance(node, ast.Call):
        return None
    func = node.func
    if (
        isinstance(func, ast.Attribute)
        and func.attr == "connect"
        and _root_name(func.value) in _DRIVERS
        and not _from_conninfo(node)
    ):
        return "a driver's connect(...) not given PgTarget.conninfo(...)"
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if name in ("create_engine", "create_async_engine", "ConnectionPool", "AsyncConnectionPool"):
        return f"{name}(...)"
    return None


def test_no_engine_module_opens_a_postgres_connection_around_pg_target() -> None:
    """Every PostgreSQL session the engine opens pins the settings, in one of two places.

    A driver's connect is given PgTarget's conninfo (which pins them in the
    startup packet), and the one SQLAlchemy engine (the SQL sink's) pins them
    on each new connection (``sinks/sql/pg_session.py``). No pool, no other
    driver, no other engine. The demo's own harness (reconcile/demo) and
    benchmarks are not the engine.
    """
    for bypass in (
        "psycopg.connect(dsn)",
        "psycopg.Connection.connect(dsn)",
        "adbc.connect(dsn)",
        "sa.create_engine(url)",
        "ConnectionPool(dsn)",
        "from psycopg import connect",
        "import psycopg_pool",
    ):  # the scan does see each way around
        assert any(_bypasses(n) for n in ast.walk(ast.parse(bypass))), bypass
    assert not any(_bypasses(n) for n in ast.walk(ast.parse("psycopg.connect(t.conninfo())")))
    allowed = {("sinks/sql/binding.py", "create_engine(...)")}
    offenders, seen = [], set()
    for folder in ("reconcile", "sinks", "expected_state"):
        for path in (REPO / folder).rglob("*.py"):
            rel = path.relative_to(REPO).as_posix()
            if rel.startswith("reconcile/demo/"):
                continue
            for node in ast.walk(ast.parse(path.read_text(), rel)):
                found = _bypasses(node)
                if found is None:
                    continue
                if (rel, found) in allowed:
                    seen.add((rel, found))
                    continue
                offenders.append(f"{rel}:{getattr(node, 'lineno', '?')}: {found}")
    assert offenders == [], offenders
    assert seen == allowed
    binding = (REPO / "sinks/sql/binding.py").read_text()
    assert "pin_postgres_sessions(engine)" in binding
