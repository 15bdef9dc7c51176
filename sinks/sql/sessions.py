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
from typing import Any

import sqlalchemy as sa

__all__ = ["SESSION_DIALECTS", "SessionNotEndedError", "end_session", "session_of"]

SESSION_DIALECTS = frozenset({"mysql", "mariadb"})
_UNKNOWN_THREAD = 1094  # ER_NO_SUCH_THREAD: the session is gone already


class SessionNotEndedError(sa.exc.SQLAlchemyError):
    """The old session is still in the process list after KILL: its outcome can still change."""


def session_of(conn: sa.Connection) -> int | None:
    """The server's id of ``conn``'s session (MariaDB, MySQL); None elsewhere."""
    if conn.dialect.name not in SESSION_DIALECTS:
        return None
    dbapi: Any = conn.connection.dbapi_connection
    thread_id = getattr(dbapi, "thread_id", None)
    value = thread_id() if callable(thread_id) else None
    return int(value) if value is not None else None


def end_session(engine: sa.Engine, session: int, timeout_s: float = 30.0) -> None:
    """KILL ``session`` and wait until the server has finished it (its txn is decided).

    Raises:
        SessionNotEndedError: still there after ``timeout_s``.
        sa.exc.SQLAlchemyError: the server cannot be reached.
    """
    with engine.connect() as conn:
        try:
            conn.exec_driver_sql(f"KILL CONNECTION {int(session)}")
        except sa.exc.DBAPIError as err:
            code = getattr(err.orig, "args", (None,))[0]
            # Gone already (it ended with its socket, or the server restarted):
            # nothing of it can change any more.
            if code != _UNKNOWN_THREAD:
                raise
        conn.rollback()
        deadline = time.monotonic() + timeout_s
        find = sa.text("SELECT count(*) FROM information_schema.processlist WHERE id = :id")
        while conn.execute(find, {"id": session}).scalar_one():
            conn.rollback()
            if time.monotonic() > deadline:
                raise SessionNotEndedError(
                    f"session {session} is still running {timeout_s:.0f} s after KILL; "
                    "its transaction may still commit"
                )
            time.sleep(0.02)
