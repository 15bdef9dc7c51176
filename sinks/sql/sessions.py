"""The session an epoch's transaction runs in, and ending it after a COMMIT without reply.

MariaDB and MySQL: the connection's thread id (from the handshake, no round
trip), then ``KILL CONNECTION id`` and a wait until the thread has left the
process list. Once it has, its transaction is over, committed or rolled back,
and the marker written in it is the whole answer. Before that, a COMMIT that
the server has received but not finished (or a transaction that still waits
for its COMMIT on a half-open socket) could commit AFTER a read found no
marker; the replay would then wait on its locks. Other databases: no session
id here (SQLite's transaction dies with its file handle; PostgreSQL's own sink
terminates its backend).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

__all__ = ["SESSION_DIALECTS", "Session", "SessionNotEndedError", "end_session", "session_of"]

SESSION_DIALECTS = frozenset({"mysql", "mariadb"})
_UNKNOWN_THREAD = 1094  # ER_NO_SUCH_THREAD: the session is gone already


class SessionNotEndedError(sa.exc.SQLAlchemyError):
    """The old session is still in the process list after KILL: its outcome can still change."""


@dataclass(frozen=True)
class Session:
    """A server session: its id, and when (this process's monotonic clock) it was seen open."""

    id: int
    seen_at: float = field(default_factory=time.monotonic)


def session_of(conn: sa.Connection) -> Session | None:
    """The server's session of ``conn`` (MariaDB, MySQL); None elsewhere."""
    if conn.dialect.name not in SESSION_DIALECTS:
        return None
    dbapi: Any = conn.connection.dbapi_connection
    thread_id = getattr(dbapi, "thread_id", None)
    value = thread_id() if callable(thread_id) else None
    return Session(int(value)) if value is not None else None


def _restarted_since(conn: sa.Connection, seen_at: float) -> bool:
    """Whether the server started after ``seen_at``: its uptime is shorter than the time since.

    Uptime is whole seconds of wall-clock time, both ends truncated: it reads
    up to a second more or less than has passed. The margin of two seconds
    never takes a server that kept running for a restarted one (that would
    leave the old session alive); a restart less than three seconds after
    ``seen_at`` reads as none (then the id is killed; it may name a new session).
    """
    uptime = conn.execute(
        sa.text(
            "SELECT variable_value FROM information_schema.global_status "
            "WHERE variable_name = 'UPTIME'"
        )
    ).scalar_one()
    return int(uptime) + 2 <= time.monotonic() - seen_at


def end_session(engine: sa.Engine, session: Session, timeout_s: float = 30.0) -> None:
    """KILL ``session`` and wait until the server has finished it (its txn is decided).

    Raises:
        SessionNotEndedError: still there after ``timeout_s``.
        sa.exc.SQLAlchemyError: the server cannot be reached.
    """
    with engine.connect() as conn:
        if _restarted_since(conn, session.seen_at):
            # The server restarted: the session died with it, and its id may now
            # belong to another client's session, which must not be killed.
            return
        try:
            conn.exec_driver_sql(f"KILL CONNECTION {int(session.id)}")
        except sa.exc.DBAPIError as err:
            code = getattr(err.orig, "args", (None,))[0]
            # Gone already (it ended with its socket, or the server restarted):
            # nothing of it can change any more.
            if code != _UNKNOWN_THREAD:
                raise
        conn.rollback()
        deadline = time.monotonic() + timeout_s
        find = sa.text("SELECT count(*) FROM information_schema.processlist WHERE id = :id")
        while conn.execute(find, {"id": session.id}).scalar_one():
            conn.rollback()
            if time.monotonic() > deadline:
                raise SessionNotEndedError(
                    f"session {session.id} is still running {timeout_s:.0f} s after KILL; "
                    "its transaction may still commit"
                )
            time.sleep(0.02)
