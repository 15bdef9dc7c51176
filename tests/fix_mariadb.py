"""Fixture plugin: a throwaway MariaDB server per test session, and the SQL sink's harness on it.

The server is shared by a worker's tests (it starts in about a second), each
test takes databases of its own. A test that needs MariaDB and cannot start it
fails (``tests.mariadb_server`` names the package to install); it is never
skipped.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import pymysql
import pytest

from reconcile.core.contract import SinkTxnId
from sinks.sql.sink import SqlSink
from tests.mariadb_server import MariadbServer

__all__ = ["MariadbHarness", "MariadbServer", "MariadbTenants"]

# What the sink's own user needs (docs/mariadb.md): its database, and reading
# the grant tables that tell it who else may reach its tables.
SINK_USER_GRANTS = (
    "GRANT ALL ON `{db}`.* TO {app}",
    "GRANT SELECT ON mysql.db TO {app}",
    "GRANT SELECT ON mysql.tables_priv TO {app}",
    "GRANT SELECT ON mysql.columns_priv TO {app}",
)
_tenant_ids = itertools.count()

# Every row write of a sink's table is appended here by a trigger, in the writing
# transaction: a committed write is there once, a rolled-back one not at all.
_AUDIT = (
    "CREATE TABLE IF NOT EXISTS harness_writes (sink VARCHAR(64) NOT NULL, "
    "k VARCHAR(64) NOT NULL, v BIGINT NOT NULL, e BIGINT NOT NULL)"
)


class MariadbHarness:
    """SqlSink over one MariaDB database, a table per sink; every row write audited by a trigger.

    The key column has an exact collation (binary, NO PAD): the sink refuses
    one that takes two of the engine's keys for one (MariaDB's default
    utf8mb4_general_ci takes 'A' and 'a', utf8mb4_bin 'x' and 'x ').
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
                f"CREATE TABLE `{name}` (k VARCHAR(64) COLLATE utf8mb4_nopad_bin "
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


@dataclass
class MariadbTenants:
    """One database on the shared server, the sink's user in it, and a real co-tenant user.

    The sink's user (``app``) holds what docs/mariadb.md asks for and nothing
    global; the co-tenant starts with no privilege at all, and a test grants
    it what the case needs. Both log in from 127.0.0.1 without a password.
    """

    server: MariadbServer
    db: str
    app: str
    cotenant: str

    @staticmethod
    def account(user: str) -> str:
        return f"'{user}'@'127.0.0.1'"

    def url(self, user: str | None = None, query: str = "") -> str:
        """The SQLAlchemy URL of the database as ``user`` (default: the sink's)."""
        return self.server.url(self.db).replace("//root@", f"//{user or self.app}@") + query

    def connect(
        self, user: str | None = None, *, in_db: bool = True
    ) -> pymysql.connections.Connection[Any]:
        """An autocommit connection as ``user`` (None: root); in the database if ``in_db``."""
        return pymysql.connect(host="127.0.0.1", port=self.server.port, user=user or "root",
                               database=self.db if in_db else None, autocommit=True,
                               connect_timeout=5)  # fmt: skip

    def run(self, user: str | None, *statements: str) -> None:
        """Run statements as ``user`` (None: root); {db}, {app} and {cotenant} filled in."""
        with self.connect(user) as conn, conn.cursor() as cur:
            for statement in statements:
                cur.execute(statement.format(db=self.db, app=self.account(self.app),
                                             cotenant=self.account(self.cotenant)))  # fmt: skip


@pytest.fixture
def mariadb_tenants(mariadb_server: MariadbServer) -> Iterator[MariadbTenants]:
    """A fresh database, its sink user and a co-tenant user (both dropped after)."""
    db = mariadb_server.create_database("ten")
    n = next(_tenant_ids)
    tenants = MariadbTenants(mariadb_server, db, f"app{n}_{db[-6:]}", f"co{n}_{db[-6:]}")
    tenants.run(None, "CREATE USER {app}", "CREATE USER {cotenant}", *SINK_USER_GRANTS)
    yield tenants
    mariadb_server.drop_database(db)
    with mariadb_server.connect() as conn, conn.cursor() as cur:
        for user in (tenants.app, tenants.cotenant):
            cur.execute(f"DROP USER IF EXISTS {tenants.account(user)}")


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
