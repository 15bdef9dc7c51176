"""Fixture plugin: throwaway PostgreSQL 15 servers started from the installed binaries."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from reconcile.demo.embedded_pg import (
    EmbeddedPostgres,
    as_postgres,
    chown_to_postgres,
    free_port,
    pg_bindir,
    run_checked,
    watchdog,
)

__all__ = ["PgServer", "markers_table", "pg_bindir"]

# The servers themselves are product code (the demo and the benchmarks use them too).

PASSWORD_USER = "pwuser"
PASSWORD = "s3cret-Pa55word!"


class PgServer(EmbeddedPostgres):
    """A test server: trusted connections, plus a role that must authenticate with SCRAM."""

    def __init__(self, **settings: Any) -> None:
        super().__init__(hba=[f"host all {PASSWORD_USER} 127.0.0.1/32 scram-sha-256"], **settings)
        with self.connect() as conn:
            conn.execute(
                sql.SQL("CREATE ROLE {} LOGIN SUPERUSER PASSWORD {}").format(
                    sql.Identifier(PASSWORD_USER), sql.Literal(PASSWORD)
                )
            )

    def database_with_defaults(self, prefix: str, settings: dict[str, str]) -> str:
        """A fresh database whose defaults are ``settings`` (ALTER DATABASE ... SET); its name.

        Checked in force on a new connection, so a setting the server ignored fails here.
        """
        name = self.create_database(prefix)
        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            for setting, value in settings.items():
                conn.execute(
                    sql.SQL("ALTER DATABASE {} SET {} = {}").format(
                        sql.Identifier(name), sql.Identifier(setting), sql.Literal(value)
                    )
                )
        dsn = self.dsn(name)
        with psycopg.connect(dsn, autocommit=True) as conn:
            for setting, value in settings.items():
                shown = conn.execute(sql.SQL("SHOW {}").format(sql.Identifier(setting))).fetchone()
                assert shown is not None and shown[0] == value, (setting, shown, value)
        return name


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    """The session's shared server (max_prepared_transactions = 20). Never skipped."""
    server = PgServer()
    yield server
    server.stop()


@pytest.fixture
def pg_db(pg_server: PgServer) -> Iterator[str]:
    """A fresh database on the shared server; its libpq DSN."""
    name = pg_server.create_database()
    yield pg_server.dsn(name)
    pg_server.drop_database(name)


@pytest.fixture
def private_pg_server() -> Iterator[PgServer]:
    """A server of the test's own, for tests that kill or reconfigure it."""
    server = PgServer()
    yield server
    server.stop()


@pytest.fixture
def durable_pg_server() -> Iterator[PgServer]:
    """A server of the test's own with fsync and full-page writes on, as in production.

    For the tests whose point is durability: kill -9 of the postmaster, crash
    recovery, an acknowledged epoch that must survive them. (The other test
    servers run with fsync off, which only an OS crash could tell apart.)
    """
    server = PgServer(fsync="on", full_page_writes="on")
    yield server
    server.stop()


class PgStandby:
    """A streaming standby of a :class:`PgServer` (``pg_basebackup -R``), on its own port.

    It can be stopped and started (a synchronous primary then waits for it),
    cut off from its primary and promoted (a failover).
    """

    def __init__(self, primary: PgServer, name: str = "standby1") -> None:
        self.primary, self.name = primary, name
        self.root = Path(tempfile.mkdtemp(prefix="reconcile-pgsb-"))
        chown_to_postgres(self.root)
        self.data = self.root / "data"
        self.port = free_port()
        watchdog(self.root, self.data, pg_bindir())
        run_checked(
            [
                *as_postgres(),
                str(pg_bindir() / "pg_basebackup"),
                "-D",
                str(self.data),
                "-h",
                "127.0.0.1",
                "-p",
                str(primary.port),
                "-U",
                "postgres",
                "-R",
                "-X",
                "stream",
                "-c",
                "fast",
                "--no-sync",
            ]
        )
        # The copied postgresql.auto.conf carries the primary's port and socket
        # folder, and -R appended primary_conninfo: later lines win.
        self._conninfo = f"host=127.0.0.1 port={primary.port} user=postgres application_name={name}"
        self._configure(self._conninfo)
        self.start()

    def _configure(self, primary_conninfo: str) -> None:
        settings = {
            "port": self.port,
            "unix_socket_directories": str(self.root),
            "primary_conninfo": primary_conninfo,
        }
        with (self.data / "postgresql.auto.conf").open("a") as conf:
            conf.write("".join(f"{k} = '{v}'\n" for k, v in settings.items()))

    def _pg_ctl(self, *args: str) -> None:
        run_checked([*as_postgres(), str(pg_bindir() / "pg_ctl"), "-D", str(self.data), *args])

    def start(self) -> None:
        self._pg_ctl("-l", str(self.root / "server.log"), "-w", "-t", "60", "start")

    def stop(self) -> None:
        self._pg_ctl("-m", "fast", "-w", "stop")

    def wait_caught_up(self, timeout: float = 60) -> None:
        """Until the primary sees this standby flush everything it has written."""
        deadline = time.monotonic() + timeout
        with self.primary.connect() as conn:
            while True:
                row = conn.execute(
                    "SELECT flush_lsn >= pg_current_wal_flush_lsn() FROM pg_stat_replication "
                    "WHERE application_name = %s",
                    (self.name,),
                ).fetchone()
                if row is not None and row[0]:
                    return
                if time.monotonic() > deadline:
                    raise RuntimeError(f"standby {self.name} did not catch up")
                time.sleep(0.05)

    def promote_cut_off(self) -> None:
        """Fail over to this standby with what it has now: cut it off, start it, promote it."""
        self._configure("")
        self.start()
        self._pg_ctl("-w", "promote")

    def dsn(self, dbname: str = "postgres", **extra: str) -> str:
        parts = {
            "host": "127.0.0.1",
            "port": str(self.port),
            "dbname": dbname,
            "user": "postgres",
            "sslmode": "disable",
            "gssencmode": "disable",
            **extra,
        }
        return " ".join(f"{k}={v}" for k, v in parts.items())

    def connect(self, dbname: str = "postgres") -> psycopg.Connection[Any]:
        return psycopg.connect(self.dsn(dbname), autocommit=True)

    def close(self) -> None:
        with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
            self._pg_ctl("-m", "immediate", "stop")
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture
def sync_standby_pair() -> Iterator[tuple[PgServer, PgStandby]]:
    """A primary whose commits wait for one synchronous standby, and that standby.

    ``synchronous_standby_names = '*'`` is set once the standby streams (a
    setting in force earlier would make the set-up's own commits wait).
    """
    primary = PgServer()
    standby: PgStandby | None = None
    try:
        standby = PgStandby(primary)
        with primary.connect() as conn:
            conn.execute("ALTER SYSTEM SET synchronous_standby_names = '*'")
            conn.execute("SELECT pg_reload_conf()")
        standby.wait_caught_up()
        yield primary, standby
    finally:
        if standby is not None:
            standby.close()
        primary.stop()


# ---------------------------------------------------------------------------
# The sink harness for the shared contract and chaos suites
# ---------------------------------------------------------------------------


_AUDIT = """
CREATE TABLE IF NOT EXISTS harness_writes (
    sink text NOT NULL, k text NOT NULL, v bigint NOT NULL, _epoch bigint NOT NULL,
    op text NOT NULL, xid xid8 NOT NULL DEFAULT pg_current_xact_id()
);
CREATE OR REPLACE FUNCTION harness_audit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO harness_writes (sink, k, v, _epoch, op)
    VALUES (TG_TABLE_NAME, NEW.k, NEW.v, NEW._epoch, TG_OP);
    RETURN NULL;
END $$;
"""


class PostgresHarness:
    """Postgres sinks (one table per sink name) in a fresh database of the shared server.

    ``committed`` reads the database directly. The sink upserts into a keyed
    table, where a second write of a row would replace the first and vanish;
    so every table has an AFTER INSERT OR UPDATE trigger that appends each row
    write to ``harness_writes`` in the writing transaction. A committed write
    is there exactly once; a rolled-back one is not there at all; an epoch
    written twice appears twice. ``prepared`` reads ``pg_prepared_xacts``.
    """

    def __init__(self, dsn: str, mode: str) -> None:
        self.kind = "postgres" if mode == "transactional" else "postgres_prepared"
        self.mode = mode
        self.dsn = dsn

    @classmethod
    def on(cls, server: PgServer, dbname: str, mode: str) -> PostgresHarness:
        return cls(server.dsn(dbname), mode)

    def new_sink(self, name: str) -> Any:
        from sinks.postgres.factory import postgres_sink

        with psycopg.connect(self.dsn, autocommit=True) as conn:
            # Set up once per table: a restarted process must not take a lock on
            # a table that a stranded prepared txn holds (the DDL would wait forever).
            exists = conn.execute("SELECT to_regclass(%s)", (f'"{name}"',)).fetchone()
            if exists is None or exists[0] is None:
                with conn.transaction():
                    conn.execute(_AUDIT)
                    conn.execute(
                        sql.SQL(
                            "CREATE TABLE {0} (k text PRIMARY KEY, v bigint NOT NULL, "
                            "_epoch bigint NOT NULL); "
                            "CREATE TRIGGER harness_audit AFTER INSERT OR UPDATE ON {0} "
                            "FOR EACH ROW EXECUTE FUNCTION harness_audit()"
                        ).format(sql.Identifier(name))
                    )
        return postgres_sink(self.dsn, name, mode=self.mode, name=name)

    def committed(self, name: str) -> dict[int, list[dict[str, Any]]]:
        out: dict[int, list[dict[str, Any]]] = {}
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            exists = conn.execute("SELECT to_regclass(%s)", (f'"{name}"',)).fetchone()
            if exists is None or exists[0] is None:
                return out
            writes = conn.execute(
                "SELECT _epoch, k, v FROM harness_writes WHERE sink = %s ORDER BY _epoch, k, v",
                (name,),
            )
            for epoch, k, v in writes:
                out.setdefault(int(epoch), []).append({"k": k, "v": int(v)})
            # The table holds the last write of each key: the audit must agree with it.
            query = sql.SQL("SELECT _epoch, k, v FROM {}").format(sql.Identifier(name))
            current = {(int(e), k, int(v)) for e, k, v in conn.execute(query)}
            last_writes = {(e, r["k"], r["v"]) for e, rows in out.items() for r in rows}
            assert current <= last_writes, f"rows not seen by the audit: {current - last_writes}"
            table = markers_table(conn)
            markers = (
                {
                    int(r[0])
                    for r in conn.execute(
                        sql.SQL("SELECT epoch FROM {} WHERE sink = %s").format(table), (name,)
                    )
                }
                if table is not None
                else set()
            )
        # I2: no row without its epoch's marker (the marker commits with the data).
        assert set(out) <= markers, f"rows of epochs {set(out) - markers} have no marker"
        return out

    def prepared(self, name: str) -> list[Any]:
        from reconcile.core.contract import SinkTxnId, TxnIdParseError

        found = []
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            for (gid,) in conn.execute(
                "SELECT gid FROM pg_prepared_xacts WHERE database = current_database()"
            ):
                try:
                    txn_id = SinkTxnId.from_string(gid)
                except TxnIdParseError:
                    continue
                if txn_id.sink == name:
                    found.append(txn_id)
        return sorted(found)


def markers_table(conn: psycopg.Connection[Any]) -> sql.Identifier | None:
    """The qualified marker table, wherever the sink put it (None before the first sink)."""
    row = conn.execute(
        "SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE c.relname = 'reconcile_commits'"
    ).fetchone()
    return None if row is None else sql.Identifier(row[0], "reconcile_commits")


@pytest.fixture
def postgres_harness(pg_server: PgServer) -> Iterator[PostgresHarness]:
    """Transactional mode: prepare keeps the txn open (not durable across a restart)."""
    name = pg_server.create_database("h")
    yield PostgresHarness.on(pg_server, name, "transactional")
    pg_server.drop_database(name)


@pytest.fixture
def postgres_prepared_harness(pg_server: PgServer) -> Iterator[PostgresHarness]:
    """Prepared mode: PREPARE TRANSACTION, durable across restarts."""
    name = pg_server.create_database("hp")
    yield PostgresHarness.on(pg_server, name, "prepared")
    with pg_server.connect(name) as conn:
        for (gid,) in conn.execute(
            "SELECT gid FROM pg_prepared_xacts WHERE database = current_database()"
        ).fetchall():
            conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)))
    pg_server.drop_database(name)
