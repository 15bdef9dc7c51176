"""Sink sessions: a sink client's pooled connection, its backend identity, and failure text."""

from __future__ import annotations

import logging
import select
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import errors

from reconcile.contract import Fatal, Retryable, SinkOutcome, SinkTxnId

from .connection import PgTarget
from .resolve import BackendIdentity, backend_identity

__all__ = ["Session", "SessionSlot", "classify_failure", "describe_failure", "looks_alive"]

log = logging.getLogger("reconcile.sinks.postgres")


@dataclass
class Session:
    """A connection and the identity of its backend (recorded once per connection)."""

    conn: psycopg.Connection[Any]
    backend: BackendIdentity


def looks_alive(conn: psycopg.Connection[Any]) -> bool:
    """An idle connection with bytes to read was closed by the server (restart, terminate).

    A zero-timeout poll of the socket costs no round trip; reusing a dead
    connection would turn the next epoch into a needless Retryable.
    """
    if conn.closed or conn.broken:
        return False
    try:
        readable, _, _ = select.select([conn.fileno()], [], [], 0)
    except (OSError, ValueError, psycopg.Error):
        return False
    return not readable


class SessionSlot:
    """At most one idle session of a sink client, reused across epochs.

    A session is owned by whoever took it until it is released; an open epoch
    txn keeps its session, and a second concurrent user gets a new connection.
    """

    def __init__(self, target: PgTarget, application_name: str, **settings: int | None) -> None:
        self.target = target
        self.application_name = application_name
        self.settings = settings
        self._idle: Session | None = None

    def apply_settings(self, conn: psycopg.Connection[Any]) -> None:
        """Session settings (statement_timeout, lock_timeout, ...), as parameters."""
        for setting, value in self.settings.items():
            if value is not None:
                conn.execute("SELECT set_config(%s, %s, false)", (setting, str(int(value))))

    def take(self) -> Session:
        """The idle session, or a new one."""
        session, self._idle = self._idle, None
        if session is not None and looks_alive(session.conn):
            return session
        if session is not None:
            session.conn.close()
        conn = self.target.connect(autocommit=True, application_name=self.application_name)
        try:
            self.apply_settings(conn)
            # Large epochs stage in temp tables; give them memory before the
            # session first touches one (the setting is fixed after that).
            conn.execute("SET temp_buffers = '128MB'")
            identity = backend_identity(conn)
            conn.autocommit = False
        except BaseException:
            conn.close()
            raise
        return Session(conn, identity)

    def release(self, session: Session) -> None:
        """Give a session back (kept if the slot is free and the connection is usable)."""
        if self._idle is None and not session.conn.closed and not session.conn.broken:
            self._idle = session
        else:
            session.conn.close()

    def rollback_quietly(self, session: Session) -> None:
        """Roll back after an error; a failing rollback is logged, never raised over it."""
        try:
            session.conn.rollback()
        except psycopg.Error as err:
            log.warning("rollback failed (%s); closing", self.target.redact(str(err)))
            session.conn.close()
        self.release(session)

    def close(self) -> None:
        if self._idle is not None:
            self._idle.conn.close()
            self._idle = None


def describe_failure(
    target: PgTarget, sink: str, table: str, op: str, txn_id: SinkTxnId, err: BaseException
) -> str:
    """The error text: sink, table, operation, server, SQLSTATE; password redacted."""
    state = getattr(err, "sqlstate", None)
    return target.redact(
        f"postgres sink {sink!r}, table {table}, {op}({txn_id}) on "
        f"{target.describe()} failed{f' [{state}]' if state else ''}: {str(err).strip()}"
    )


def classify_failure(message: str, err: psycopg.Error) -> SinkOutcome:
    """Sort a failure that rolled the txn back: bad data is fatal, the rest may pass on retry.

    Data, integrity and SQL errors (22xxx, 23xxx, 42xxx except privileges) fail
    again on a retry of the same epoch; connection loss, timeouts (57014), lock
    conflicts (55P03), terminated backends (57P01) and serialization failures
    (40xxx) may not.
    """
    terminal = (
        psycopg.DataError,
        psycopg.IntegrityError,
        psycopg.ProgrammingError,
        psycopg.NotSupportedError,
    )
    if isinstance(err, terminal) and not isinstance(err, errors.InsufficientPrivilege):
        return Fatal(message)
    return Retryable(message)
