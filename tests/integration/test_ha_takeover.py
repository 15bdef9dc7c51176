"""The takeover's steps on a real Postgres: the old writer's sessions ended, the fences raised.

A co-tenant (a role with nothing but LOGIN and CONNECT) may name its sessions
like the pipeline's: the takeover ignores them and still ends the real old
writer's. A fence row that stays locked is tried again; one the role may not
write is a ConfigurationError.
"""

from __future__ import annotations

import logging
import threading
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from reconcile.core.contract import ConfigurationError, RetryableError
from reconcile.engine.cycle import CommitCycle
from reconcile.engine.expected import ExpectedState
from reconcile.ha.takeover import fence_sinks, terminate_old_sessions
from sinks.postgres.factory import postgres_sink
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
    # Another role's session named like ours: the sink's role (a superuser
    # here) could end it, but it is not the pipeline's.
    impostor = psycopg.connect(as_role(pg_db, new_role(pg_db)), application_name="reconcile:p:x")
    pids = {c.info.backend_pid: c for c in (old, other_pipeline, bystander, impostor)}
    cycle = _cycle(pg_db, tmp_path / "store")
    try:
        assert terminate_old_sessions(cycle) == 1
        alive = _sessions(pg_db)
        assert old.info.backend_pid not in alive, "the old writer's session is still there"
        assert other_pipeline.info.backend_pid in alive and bystander.info.backend_pid in alive
        assert impostor.info.backend_pid in alive, "another role's session was ended"
        # Its open epoch was rolled back: the row lock is free, the row never was.
        with psycopg.connect(pg_db, autocommit=True) as conn:
            conn.execute("SET lock_timeout = '2s'")
            assert conn.execute("SELECT count(*) FROM t").fetchone() == (0,)
            conn.execute("INSERT INTO t VALUES (1, 'new leader')")
    finally:
        cycle.close()
        for conn in pids.values():
            conn.close()


def _fences(conn: psycopg.Connection[Any]) -> sql.Identifier:
    schemas = find_state_schemas(conn)
    assert schemas, "no state schema: the sink never set itself up"
    return sql.Identifier(schemas[0], FENCES_TABLE)


def _fence(dsn: str, pipeline: str) -> Any:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            sql.SQL("SELECT generation FROM {} WHERE pipeline = %s").format(_fences(conn)),
            (pipeline,),
        ).fetchone()
    return row[0] if row else None


def new_role(dsn: str, *, sink: bool = False) -> str:
    """A plain role with LOGIN (and CONNECT, as PUBLIC has); a sink's may also create."""
    name = f"r_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(name)))
        if sink:
            db = sql.Identifier(conn.info.dbname)
            conn.execute(
                sql.SQL("GRANT CREATE ON DATABASE {} TO {}").format(db, sql.Identifier(name))
            )
            conn.execute(
                sql.SQL("GRANT CREATE ON SCHEMA public TO {}").format(sql.Identifier(name))
            )
    return name


def as_role(dsn: str, role: str) -> str:
    return make_conninfo(**{**conninfo_to_dict(dsn), "user": role, "password": None})


def _sink_table(dsn: str) -> str:
    """Table t, owned by a new plain role (not a superuser); that role's DSN."""
    role = new_role(dsn, sink=True)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id bigint PRIMARY KEY, v text)")
        conn.execute(sql.SQL("ALTER TABLE t OWNER TO {}").format(sql.Identifier(role)))
    return as_role(dsn, role)


def test_a_co_tenants_session_named_like_ours_does_not_stop_the_takeover(
    pg_db: str, tmp_path: Path
) -> None:
    dsn = _sink_table(pg_db)
    # The co-tenant connects first, so that its session is listed before the old writer's.
    impostor = psycopg.connect(as_role(pg_db, new_role(pg_db)), application_name="reconcile:p:x")
    old = _cycle(dsn, tmp_path / "store")
    old.start()
    assert fence_sinks(old) == ["t"]
    old.close()
    # The old writer paused mid-epoch: its session holds the fence row and a row of t.
    paused = psycopg.connect(dsn, application_name="reconcile:p:t")
    paused.execute(sql.SQL("SELECT * FROM {} FOR UPDATE").format(_fences(paused)))
    paused.execute("INSERT INTO t VALUES (1, 'open epoch')")
    new = _cycle(dsn, tmp_path / "store")
    try:
        assert terminate_old_sessions(new) == 1
        alive = _sessions(pg_db)
        assert paused.info.backend_pid not in alive, "the old writer's session survived"
        assert impostor.info.backend_pid in alive
        new.start()
        assert fence_sinks(new, lock_timeout_ms=2000) == ["t"]
        assert _fence(pg_db, "p") == new.generation == 2
    finally:
        new.close()
        for conn in (impostor, paused):
            conn.close()


def test_a_locked_fence_is_tried_again_and_a_refused_one_stops(
    pg_db: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    dsn = _sink_table(pg_db)
    cycle = _cycle(dsn, tmp_path / "store")
    cycle.start()
    # A session the takeover does not end (not the pipeline's) holds the fence row.
    blocker = psycopg.connect(pg_db)
    blocker.execute(sql.SQL("SELECT * FROM {} FOR UPDATE").format(_fences(blocker)))
    try:
        with pytest.raises(RetryableError, match=r"sink 't': could not raise .* in 2 attempts"):
            fence_sinks(cycle, attempts=2, lock_timeout_ms=200)
        # Released after the first try failed: the second one raises the fence,
        # as the same generation.
        caplog.set_level(logging.WARNING, logger="reconcile.ha")
        caplog.clear()
        fenced: list[list[str]] = []
        worker = threading.Thread(
            target=lambda: fenced.append(fence_sinks(cycle, attempts=2, lock_timeout_ms=300))
        )
        worker.start()
        for _ in range(200):
            if any("fence of sink t not raised" in r.getMessage() for r in caplog.records):
                break
            worker.join(0.05)
        blocker.rollback()
        worker.join(30)
        assert fenced == [["t"]] and _fence(pg_db, "p") == cycle.generation
        # The role may no longer write its fence: no retry helps, the message names the sink.
        blocker.execute(sql.SQL("REVOKE UPDATE ON {} FROM {}").format(
            _fences(blocker), sql.Identifier(conninfo_to_dict(dsn)["user"])))  # fmt: skip
        blocker.commit()
        with pytest.raises(ConfigurationError, match=r"sink 't': cannot raise its fence"):
            fence_sinks(cycle, attempts=3, lock_timeout_ms=200)
    finally:
        cycle.close()
        blocker.close()


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
