"""Postgres sink sessions: statement, lock and idle-in-transaction timeouts, and what they end."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from reconcile.core import hooks
from reconcile.core.progress import MARK_CHECKED
from reconcile.engine.cycle import CommitCycle, CommitSucceeded
from reconcile.engine.progress_file import FileProgressLog
from sinks.postgres import session
from sinks.postgres.sink import PostgresSink
from tests.fix_pg import PgServer

pytestmark = pytest.mark.integration

PIPE = "pipe"


def session_settings(sink: PostgresSink) -> tuple[str, str, str]:
    """What the server says the sink's own session has."""
    taken = sink._sessions.take()
    try:
        row = taken.conn.execute(
            "SELECT current_setting('statement_timeout'), current_setting('lock_timeout'), "
            "current_setting('idle_in_transaction_session_timeout')"
        ).fetchone()
        taken.conn.rollback()
    finally:
        sink._sessions.release(taken)
    assert row is not None
    return row[0], row[1], row[2]


def test_sessions_get_default_timeouts_explicit_ones_and_keep_the_servers(
    pg_server: PgServer,
) -> None:
    db = pg_server.create_database("to")
    try:
        dsn = pg_server.dsn(db)
        with pg_server.connect(db) as conn:
            conn.execute("CREATE TABLE t (id bigint PRIMARY KEY)")
        sink = PostgresSink(dsn, "t", name="t", pipeline=PIPE)
        assert session_settings(sink) == ("15min", "1min", "5min")
        sink.close()
        sink = PostgresSink(
            dsn, "t", name="t", pipeline=PIPE, statement_timeout_ms=1234, lock_timeout_ms=0
        )
        # An explicit 0 disables the limit, as in PostgreSQL.
        assert session_settings(sink) == ("1234ms", "0", "5min")
        sink.close()
        # A limit set by the DBA (database, role or server) stands.
        with pg_server.connect(db) as conn:
            conn.execute(
                sql.SQL("ALTER DATABASE {} SET statement_timeout = '42s'").format(
                    sql.Identifier(db)
                )
            )
        sink = PostgresSink(dsn, "t", name="t", pipeline=PIPE)
        assert session_settings(sink) == ("42s", "1min", "5min")
        sink.close()
    finally:
        pg_server.drop_database(db)


def _backends(dsn: str, app: str, state: str | None = None) -> list[int]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s "
            "AND (%s::text IS NULL OR state = %s)",
            (app, state, state),
        ).fetchall()
    return [int(r[0]) for r in rows]


def test_an_idle_epoch_txn_is_ended_by_the_server_and_the_epoch_commits_once(
    pg_server: PgServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(session.DEFAULT_TIMEOUTS_MS, "idle_in_transaction_session_timeout", 500)
    db = pg_server.create_database("idle")
    try:
        dsn = pg_server.dsn(db)
        with pg_server.connect(db) as conn:
            conn.execute("CREATE TABLE t (id bigint PRIMARY KEY, v bigint, _epoch bigint)")
        sink = PostgresSink(dsn, "t", name="t", pipeline=PIPE)
        cycle = CommitCycle(PIPE, [sink], FileProgressLog(tmp_path, PIPE))
        cycle.start()
        ended: list[int] = []

        def slow_other_sinks() -> None:
            # Right before the commit point is made durable, the sink's epoch
            # txn is open and idle; wait (bounded) until the server ends it.
            idle = _backends(dsn, sink.application_name, "idle in transaction")
            assert len(idle) == 1, idle
            deadline = time.monotonic() + 30
            while idle[0] in _backends(dsn, sink.application_name):
                assert time.monotonic() < deadline, "the server did not end the idle txn"
                time.sleep(0.05)
            ended.append(idle[0])

        rows = [{"id": i, "v": i * 10} for i in range(50)]
        # The second progress mark of the epoch is its commit point (COMMITTED).
        with hooks.at(MARK_CHECKED, slow_other_sinks, nth=2) as window:
            result = cycle.run_epoch(1, {"t": rows})
        assert window.fired == 1 and len(ended) == 1
        assert result == CommitSucceeded(1)
        assert cycle.run_epoch(2, {"t": [{"id": 100, "v": 1}]}) == CommitSucceeded(2)
        cycle.close()
        with psycopg.connect(dsn, autocommit=True) as conn:
            got: list[Any] = conn.execute(
                "SELECT _epoch, count(*), sum(v) FROM t GROUP BY 1 ORDER BY 1"
            ).fetchall()
            marks = conn.execute(
                "SELECT epoch, row_count FROM reconcile.reconcile_commits ORDER BY epoch"
            ).fetchall()
        assert got == [(1, 50, sum(i * 10 for i in range(50))), (2, 1, 1)]
        assert marks == [(1, 50), (2, 1)]
    finally:
        pg_server.drop_database(db)
