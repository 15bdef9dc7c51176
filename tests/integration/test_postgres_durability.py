"""Durability of acknowledged epochs: synchronous_commit at least on; kill -9 with fsync on."""

from __future__ import annotations

import uuid
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from reconcile.engine.cycle import CommitCycle, CommitSucceeded
from reconcile.engine.progress_file import FileProgressLog
from sinks.postgres.factory import postgres_sink
from tests.fix_pg import PgServer

pytestmark = pytest.mark.integration

PIPE = "shop"


def async_role(server: PgServer, db: str) -> str:
    """A role whose default is synchronous_commit = off (a common tuning)."""
    role = f"async_{uuid.uuid4().hex[:8]}"
    with server.connect(db) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN SUPERUSER").format(sql.Identifier(role)))
        conn.execute(
            sql.SQL("ALTER ROLE {} SET synchronous_commit = off").format(sql.Identifier(role))
        )
    return role


@pytest.mark.parametrize("mode", ["transactional", "prepared"])
def test_epoch_txns_run_with_synchronous_commit_on_under_a_role_default_of_off(
    pg_server: PgServer, tmp_path: Path, mode: str
) -> None:
    db = pg_server.create_database()
    role = async_role(pg_server, db)
    with pg_server.connect(db) as conn:
        # A trigger records the setting in effect inside the txn that writes the row.
        conn.execute(
            "CREATE TABLE a (k text PRIMARY KEY, v bigint, _epoch bigint, seen text); "
            "CREATE FUNCTION seen() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN "
            "NEW.seen := current_setting('synchronous_commit'); RETURN NEW; END$$; "
            "CREATE TRIGGER seen BEFORE INSERT ON a FOR EACH ROW EXECUTE FUNCTION seen()"
        )
    dsn = pg_server.dsn(db, user=role)
    with psycopg.connect(dsn, autocommit=True) as conn:  # the role default, outside the sink
        conn.execute("INSERT INTO a (k, v) VALUES ('plain', 0)")
    c = CommitCycle(
        PIPE, [postgres_sink(dsn, "a", mode=mode, name="orders")], FileProgressLog(tmp_path, PIPE)
    )
    c.start()
    assert c.run_epoch(0, {"orders": [{"k": "x", "v": 1}]}) == CommitSucceeded(0)
    c.close()
    with pg_server.connect(db) as conn:
        seen = dict(conn.execute("SELECT k, seen FROM a").fetchall())
    assert seen == {"plain": "off", "x": "on"}


def test_an_acknowledged_epoch_survives_kill9_under_a_role_default_of_off(
    tmp_path: Path,
) -> None:
    # fsync on; the WAL writer flushes asynchronous commits only every 10 s,
    # so a commit that did not wait for its own flush is lost by the kill.
    server = PgServer(fsync="on", full_page_writes="on", wal_writer_delay="10000ms")
    try:
        db = server.create_database()
        role = async_role(server, db)
        with server.connect(db) as conn:
            conn.execute("CREATE TABLE a (k text PRIMARY KEY, v bigint, _epoch bigint)")
            conn.execute("CHECKPOINT")
        sink = postgres_sink(server.dsn(db, user=role), "a", name="orders")
        c = CommitCycle(PIPE, [sink], FileProgressLog(tmp_path, PIPE))
        c.start()
        with server.connect(db) as conn:
            conn.execute("CHECKPOINT")  # start-up's own writes are on disk
        rows = [{"k": f"r{i}", "v": i} for i in range(50)]
        assert c.run_epoch(0, {"orders": rows}) == CommitSucceeded(0)
        server.kill9()
        server.restart_after_crash()
        with server.connect(db) as conn:
            assert conn.execute("SELECT count(*) FROM a").fetchone() == (50,)
            assert conn.execute(
                "SELECT count(*) FROM reconcile.reconcile_commits WHERE epoch = 0"
            ).fetchone() == (1,)
    finally:
        server.stop()
