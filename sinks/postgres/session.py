"""Sink sessions: a sink client's pooled connection, its backend identity, and failure text."""

from __future__ import annotations

import logging
import select
from dataclasses import dataclass
from typing import Any

import psycopg

from reconcile.core.contract import (
    Fatal,
    FatalError,
    RejectedError,
    Retryable,
    RetryableError,
    SinkOutcome,
    SinkTxnId,
)
from reconcile.core.decisions import is_rejection_sqlstate

from .connection import PgTarget
from .heavy import DEFAULT_STATEMENT_TIMEOUT_MS, settings_sql
from .resolve import BackendIdentity, backend_identity

__all__ = [
    "DEFAULT_TIMEOUTS_MS",
    "Session",
    "SessionSlot",
    "classify_failure",
    "describe_failure",
    "looks_alive",
]

log = logging.getLogger("reconcile.sinks.postgres")

# Session timeouts (milliseconds) for a setting that the sink's constructor
# leaves at None and that the server, database or role does not set already.
# They bound how long an epoch txn can hold the fence row and its row locks;
# each is far above what a normal epoch needs, so that only a stuck one ends:
# - statement_timeout, 15 min: the longest single statement of an epoch is its
#   COPY or INSERT ... SELECT (or one chunk in prepared mode); at the slowest
#   measured rate (~140k rows/s, every row an ON CONFLICT update) that is
#   over 100 million rows.
# - lock_timeout, 60 s: waits for row locks of other writers and for DDL; a
#   longer wait ends as Retryable, and the epoch is retried.
# - idle_in_transaction_session_timeout, 5 min: in transactional mode the epoch
#   txn waits, idle, from its prepare() to its commit() while the other sinks
#   prepare and the progress log is made durable. If a slow sink keeps it
#   waiting longer, the server ends the session and rolls the txn back; the
#   ambiguous COMMIT then resolves as aborted and the commit cycle replays the
#   epoch into this sink (exactly once: the marker). Prepared mode is not
#   affected: a prepared txn belongs to no session.
DEFAULT_TIMEOUTS_MS: dict[str, int] = {
    "statement_timeout": DEFAULT_STATEMENT_TIMEOUT_MS,
    "lock_timeout": 60_000,
    "idle_in_transaction_session_timeout": 5 * 60_000,
}


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
        """Session settings (statement_timeout, lock_timeout, ..., and ``heavy.FIXED_SETTINGS``).

        A setting given as None gets ``DEFAULT_TIMEOUTS_MS``, unless the server,
        database or role already sets it (non-zero): a DBA's choice stands.
        """
        # The heavy-session settings (``heavy.py``: JIT off, client checks) in
        # the same round trip: a repair's and a large epoch's statements run here.
        conn.execute(settings_sql(self.settings, DEFAULT_TIMEOUTS_MS))

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


def classify_failure(
    message: str, err: psycopg.Error, *, epoch: int, table: str, sink: str
) -> SinkOutcome:
    """Sort a failure that rolled the txn back: a rejection is fatal, the rest may pass on retry.

    A definite rejection by the server (the SQLSTATE classes of
    ``reconcile.core.decisions.REJECTING_SQLSTATE``: data 22, integrity 23, access
    and privilege 42, check option 44, cardinality 21, program limits 54)
    fails again on a retry of the same epoch: Fatal with a RejectedError
    that names the epoch, the table and the constraint or column the server
    named. Other statement errors that no retry fixes (0A and the rest of
    psycopg's ProgrammingError) are Fatal too. Connection loss, timeouts
    (57014), lock conflicts (55P03), terminated backends (57P01) and
    serialization failures (40xxx) may not: Retryable.
    """
    state = getattr(err, "sqlstate", None) or ""
    if is_rejection_sqlstate(state):
        diag = err.diag
        reason = diag.message_primary or str(err).strip().splitlines()[0]
        rejected = RejectedError.of(
            epoch=epoch, table=table, sqlstate=state, reason=reason, sink=sink,
            constraint=diag.constraint_name, column=diag.column_name,
        )  # fmt: skip
        return Fatal(message, rejected)
    if isinstance(err, psycopg.ProgrammingError | psycopg.NotSupportedError):
        return Fatal.of(FatalError(message, sqlstate=state))
    return Retryable.of(RetryableError(message, sqlstate=state))
