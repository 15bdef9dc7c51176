"""Fixture plugin: a throwaway MariaDB server per test session, and the SQL sink's harness on it.

The server is shared by a worker's tests (it starts in about a second), each
test takes databases of its own. A test that needs MariaDB and cannot start it
fails (``tests.mariadb_server`` names the package to install); it is never
skipped.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pymysql
import pytest

from reconcile.core.contract import SinkTxnId
from sinks.sql.sink import SqlSink
from tests.mariadb_server import MariadbServer

__all__ = ["MariadbHarness", "MariadbServer"]

# Every row write of a sink's table is appended here by a trigger, in the writing
# transaction: a committed write is there once, a rolled-back one not at all.
_AUDIT = (
    "CREATE TABLE IF NOT EXISTS harness_writes (sink VARCHAR(64) NOT NULL, "
    "k VARCHAR(64) NOT NULL, v BIGINT NOT NULL, e BIGINT NOT NULL)"
)


class MariadbHarness:
    """SqlSink over one MariaDB database, a table per sink; every row write audited by a trigger.

    The key column has a binary collation: MariaDB's default (utf8mb4_general_ci)
    compares 'A' and 'a' as one key, the engine's keys never do.
    """

    kind = "mariadb"

    def __init__(self, url: str) -> None:
        self._connect_args = _parse(url)
        # A writer that finds a row locked waits innodb_lock_wait_timeout (50 s by
        # default) before it is told to retry; the suite's fencing check meets such a
        # lock, and a second shows the same outcome.
        self.url = f"{url}?init_command={quote('SET SESSION innodb_lock_wait_timeout = 1')}"

    def _connect(self) -> pymysql.connections.Connection[Any]:
        # A DDL that waits for an open epoch's metadata lock fails in seconds, not in a year.
        return pymysql.connect(
            **self._connect_args, autocommit=True, connect_timeout=5,
            init_command="SET SESSION lock_wait_timeout = 10",
        )  # fmt: skip

    def new_sink(self, name: str) -> SqlSink:
        with self._connect() as conn, conn.cursor() as cur:
            # Set up once per table, looked up in the catalog: a CREATE ... IF NOT EXISTS
            # would wait for the metadata lock of an epoch a former sink left open.
            cur.execute(
                "SELECT count(*) FROM information_schema.tables WHERE table_schema = DATABASE() "
                "AND table_name = %s",
                (name,),
            )
            row = cur.fetchone()
            if row is not None and row[0]:
                return SqlSink(self.url, name, name=name)
            cur.execute(_AUDIT)
            cur.execute(
                f"CREATE TABLE `{name}` (k VARCHAR(64) COLLATE utf8mb4_bin "
                "PRIMARY KEY, v BIGINT NOT NULL, _epoch BIGINT NOT NULL)"
            )
            cur.execute(
                f"CREATE TRIGGER `audit_{name}` AFTER INSERT ON `{name}` "
                f"FOR EACH ROW INSERT INTO harness_writes VALUES (%s, NEW.k, NEW.v, NEW._epoch)",
                (name,),
            )
        return SqlSink(self.url, name, name=name)

    def committed(self, name: str) -> dict[int, list[dict[str, Any]]]:
        out: dict[int, list[dict[str, Any]]] = {}
        with self._connect() as conn, conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM information_schema.tables WHERE "
                        "table_schema = DATABASE() AND table_name = 'harness_writes'")  # fmt: skip
            row = cur.fetchone()
            if row is None or not row[0]:
                return out
            cur.execute("SELECT k, v, e FROM harness_writes WHERE sink = %s ORDER BY e, k", (name,))
            for k, v, e in cur.fetchall():
                out.setdefault(int(e), []).append({"k": k, "v": int(v)})
        return out

    def prepared(self, name: str) -> list[SinkTxnId]:
        return []  # an epoch's transaction never outlives its connection


def _parse(url: str) -> dict[str, Any]:
    """pymysql's connection arguments of a ``mariadb+pymysql://`` URL (the harness's own reads)."""
    import sqlalchemy as sa

    parsed = sa.make_url(url)
    return {
        "host": parsed.host,
        "port": parsed.port,
        "user": parsed.username,
        "password": parsed.password or "",
        "database": parsed.database,
    }


@pytest.fixture(scope="session")
def mariadb_server() -> Iterator[MariadbServer]:
    """The session's shared MariaDB server. Never skipped: no server, the test fails."""
    server = MariadbServer()
    yield server
    server.stop()


@pytest.fixture
def mariadb_db(mariadb_server: MariadbServer) -> Iterator[str]:
    """A fresh database on the shared server; its SQLAlchemy URL."""
    name = mariadb_server.create_database()
    yield mariadb_server.url(name)
    mariadb_server.drop_database(name)


@pytest.fixture
def mariadb_harness(mariadb_server: MariadbServer) -> Iterator[MariadbHarness]:
    name = mariadb_server.create_database("h")
    yield MariadbHarness(mariadb_server.url(name))
    mariadb_server.drop_database(name)
