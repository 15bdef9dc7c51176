"""The open-transaction lifecycle (``sinks.open_txn``), the same for the Postgres and SQL sinks.

Real Postgres, through psycopg (the Postgres sink's transactional mode) and
through SQLAlchemy (the SQL sink): an epoch's transaction left open by
``prepare`` whose connection dies is aborted without an error and leaves
nothing behind; the epoch then goes through; an abort of the committed epoch
is refused, and the committed rows stay.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg import sql

from reconcile.core.contract import OK, Fatal, SinkTxnId
from sinks.postgres import PostgresSink
from sinks.sql import SqlSink
from tests.fix_pg import PgServer

pytestmark = pytest.mark.integration

PIPE = "shop"


def sink_of(kind: str, server: PgServer, database: str) -> Any:
    if kind == "postgres":
        return PostgresSink(server.dsn(database), "lines", name="lines", pipeline=PIPE)
    url = f"postgresql+psycopg://postgres@127.0.0.1:{server.port}/{database}"
    return SqlSink(url, "lines", name="lines", pipeline=PIPE)


def open_txns(dsn: str) -> list[int]:
    """Backends of this database that hold a transaction open (the epoch's)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND state LIKE 'idle in transaction%' AND pid <> pg_backend_pid()"
        ).fetchall()
    return [int(r[0]) for r in rows]


def committed(dsn: str) -> tuple[int, int]:
    """(rows in the target, markers of the pipeline): what the database holds.

    The markers are in whichever marker table the sink wrote: ``reconcile_commits``
    (the Postgres sink) or ``reconcile_sql_commits`` (the SQL sink).
    """
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM lines").fetchone()
        tables = conn.execute(
            "SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n "
            "ON n.oid = c.relnamespace "
            "WHERE c.relname IN ('reconcile_commits', 'reconcile_sql_commits')"
        ).fetchall()
        markers = 0
        for schema, name in tables:
            query = sql.SQL("SELECT count(*) FROM {} WHERE pipeline = %s")
            found = conn.execute(query.format(sql.Identifier(schema, name)), (PIPE,)).fetchone()
            markers += int(found[0]) if found else 0
    assert row is not None
    return int(row[0]), markers


@pytest.mark.parametrize("kind", ["postgres", "sql"])
def test_an_abort_whose_connection_died_is_ok_and_leaves_nothing(
    pg_server: PgServer, kind: str
) -> None:
    database = pg_server.create_database("opentxn")
    dsn = pg_server.dsn(database)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE lines (id bigint PRIMARY KEY, qty int NOT NULL)")
    sink = sink_of(kind, pg_server, database)
    try:
        if kind == "postgres":
            sink.setup()
        txn = SinkTxnId(PIPE, "lines", 0, 0)
        assert sink.stage(txn, [{"id": 1, "qty": 3}, {"id": 2, "qty": 4}]) == OK
        assert sink.prepare(txn) == OK
        held = open_txns(dsn)
        assert len(held) == 1  # the epoch's transaction, open until commit
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_terminate_backend(%s)", (held[0],))
        # Its rollback fails (the connection is gone); the server rolled it back.
        assert sink.abort(txn) == OK
        assert committed(dsn) == (0, 0) and open_txns(dsn) == []
        # The epoch goes through on a fresh connection, once.
        assert sink.stage(txn, [{"id": 1, "qty": 3}, {"id": 2, "qty": 4}]) == OK
        assert sink.prepare(txn) == OK
        assert sink.commit(txn) == OK
        assert committed(dsn) == (2, 1)
        # An abort of the committed epoch is refused; the rows stay.
        refused = sink.abort(txn)
        assert isinstance(refused, Fatal), refused
        assert "already committed; committed data stays" in refused.reason
        assert committed(dsn) == (2, 1)
    finally:
        sink.close()
        pg_server.drop_database(database)
