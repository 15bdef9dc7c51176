"""The takeover's steps on a real Postgres: the old writer's sessions ended, the fences raised."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg

from reconcile.cycle import CommitCycle
from reconcile.expected import ExpectedState
from reconcile.ha.takeover import fence_sinks, terminate_old_sessions
from sinks.postgres import postgres_sink
from sinks.postgres.health import find_state_schemas
from sinks.postgres.markers import FENCES_TABLE


def _cycle(dsn: str, store: Path, pipeline: str = "p") -> CommitCycle:
    expected = ExpectedState(str(store), pipeline, {"t": ["id"]})
    return CommitCycle(pipeline, [postgres_sink(dsn, "t", name="t")], expected_state=expected)


def _sessions(dsn: str) -> dict[int, str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid, application_name FROM pg_stat_activity WHERE datname = current_database()"
        ).fetchall()
    return {int(pid): str(name) for pid, name in rows}


def test_the_old_writers_sessions_are_ended_and_no_other(pg_db: str, tmp_path: Path) -> None:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id bigint PRIMARY KEY, v text)")
    # The old writer: a session of pipeline p's sink, idle in an open txn (a
    # paused main's epoch) holding a row lock; and two bystanders.
    old = psycopg.connect(pg_db, application_name="reconcile:p:t")
    old.execute("INSERT INTO t VALUES (1, 'open epoch')")
    other_pipeline = psycopg.connect(pg_db, application_name="reconcile:px:t")
    bystander = psycopg.connect(pg_db, application_name="someone-else")
    pids = {c.info.backend_pid: c for c in (old, other_pipeline, bystander)}
    cycle = _cycle(pg_db, tmp_path / "store")
    try:
        assert terminate_old_sessions(cycle) == 1
        alive = _sessions(pg_db)
        assert old.info.backend_pid not in alive, "the old writer's session is still there"
        assert other_pipeline.info.backend_pid in alive and bystander.info.backend_pid in alive
        # Its open epoch was rolled back: the row lock is free, the row never was.
        with psycopg.connect(pg_db, autocommit=True) as conn:
            conn.execute("SET lock_timeout = '2s'")
            assert conn.execute("SELECT count(*) FROM t").fetchone() == (0,)
            conn.execute("INSERT INTO t VALUES (1, 'new leader')")
    finally:
        cycle.close()
        for conn in pids.values():
            conn.close()


def _fence(dsn: str, pipeline: str) -> Any:
    with psycopg.connect(dsn, autocommit=True) as conn:
        schemas = find_state_schemas(conn)
        assert schemas, "no state schema: the sink never set itself up"
        row = conn.execute(
            psycopg.sql.SQL("SELECT generation FROM {} WHERE pipeline = %s").format(
                psycopg.sql.Identifier(schemas[0], FENCES_TABLE)
            ),
            (pipeline,),
        ).fetchone()
    return row[0] if row else None


def test_fence_sinks_raises_every_postgres_fence_at_takeover(pg_db: str, tmp_path: Path) -> None:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id bigint PRIMARY KEY, v text)")
    old, new = _cycle(pg_db, tmp_path / "store"), _cycle(pg_db, tmp_path / "store")
    try:
        old.start()
        new.start()
        assert (old.generation, new.generation) == (1, 2)
        before = _fence(pg_db, "p")
        assert before is None or before < 2, "the claim alone raised the fence: nothing to test"
        assert fence_sinks(new) == ["t"]
        # In Postgres itself: the fence is at the new generation before any epoch.
        assert _fence(pg_db, "p") == 2
    finally:
        old.close()
        new.close()
