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
import json
import random
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from reconcile import recover
from reconcile.cli import main
from sinks.postgres.connection import SESSION_SETTINGS, PgTarget
from tests.fix_pg import PgServer
from tests.recovery_setup import (
    TYPES_DDL,
    TYPES_KEYS,
    TYPES_SCHEMA,
    expected_rows,
    make_setup,
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
    name = pg_server.create_database("hostile")
    with psycopg.connect(pg_server.dsn(), autocommit=True) as conn:
        for setting, value in HOSTILE.items():
            conn.execute(
                sql.SQL("ALTER DATABASE {} SET {} = {}").format(
                    sql.Identifier(name), sql.Identifier(setting), sql.Literal(value)
                )
            )
    dsn = pg_server.dsn(name)
    with psycopg.connect(dsn, autocommit=True) as conn:  # the defaults are in force
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


def _from_conninfo(call: ast.Call) -> bool:
    """Whether the call's first argument is ``<something>.conninfo(...)``."""
    first = call.args[0] if call.args else None
    return (
        isinstance(first, ast.Call)
        and isinstance(first.func, ast.Attribute)
        and first.func.attr == "conninfo"
    )


def test_no_engine_module_opens_a_postgres_connection_around_pg_target() -> None:
    """A Postgres driver's connect is given PgTarget's conninfo (which pins the settings), only.

    The demo's own harness (reconcile/demo) and benchmarks are not the engine.
    """
    offenders = []
    for folder in ("reconcile", "sinks", "expected_state"):
        for path in (REPO / folder).rglob("*.py"):
            rel = path.relative_to(REPO).as_posix()
            if rel.startswith("reconcile/demo/") or rel == "sinks/postgres/connection.py":
                continue
            for node in ast.walk(ast.parse(path.read_text(), rel)):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "connect"
                    and isinstance(node.func.value, ast.Name)
                    and node.func.value.id in ("psycopg", "psycopg2", "adbc", "dbapi")
                    and not _from_conninfo(node)
                ):
                    offenders.append(f"{rel}:{node.lineno}")
    assert offenders == [], offenders
