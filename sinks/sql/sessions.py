"""The SQL sink's sessions on MySQL and MariaDB: their settings, their marks, and ending one.

**Settings.** Every connection the sink opens gets the session settings the
engine depends on, whatever the server's or the user's defaults
(:func:`pin_settings`): a strict ``sql_mode`` in full (a value that does not
fit is an error, never clipped to fit and committed; no mode that changes what
is read or written, such as ``PAD_CHAR_TO_FULL_LENGTH``, ``EMPTY_STRING_IS_NULL``
or ``ANSI_QUOTES``), the time zone UTC (``TIMESTAMP`` columns are converted
through it), no ``sql_select_limit`` (a pull reads every row), ``utf8mb4``,
and the table's constraints enforced (foreign keys, unique checks, MariaDB's
CHECK constraints).

**Marks.** A session that runs an epoch's (or a repair's) transaction takes
two named locks (``GET_LOCK``) before it writes (:func:`mark_session`):

- its own, ``rc:<128 random bits>``: the resolver ends a session only while
  that session still holds it, so a session id that a restart gave to
  another client is never killed;
- the writer's, ``rc:<digest of pipeline, sink and progress log id>:<session
  id>``: a takeover finds the old main's sessions by it
  (:func:`end_writer_sessions`). The log id is in the state tables, which no
  other user may read, so no one else can squat such a name.

A named lock lives as long as its session. When a session ends, the server
rolls its transaction back and only then lets go of its named locks
(``THD::cleanup``): a lock that is free again means the transaction that ran
in its session is over, committed or rolled back, and the marker written in it
is the whole answer. Before that, a COMMIT that the server has received but
not finished (or a transaction that still waits for its COMMIT on a half-open
socket) could commit AFTER a read found no marker. Other databases: no session
to end (SQLite's transaction dies with its file handle; PostgreSQL's own sink
terminates its backend).
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import time
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from reconcile.core import hooks
from reconcile.core.contract import WriterIdentity

__all__ = [
    "KILLING",
    "SESSION_DIALECTS",
    "SQL_MODE",
    "Session",
    "SessionNotEndedError",
    "end_session",
    "end_writer_sessions",
    "mark_session",
    "pin_settings",
    "writer_mark",
]

log = logging.getLogger("reconcile.sinks.sql")

SESSION_DIALECTS = frozenset({"mysql", "mariadb"})
# The whole sql_mode, not additions to the server's: every mode left out is off.
SQL_MODE = (
    "STRICT_ALL_TABLES,NO_ZERO_IN_DATE,NO_ZERO_DATE,ERROR_FOR_DIVISION_BY_ZERO,"
    "NO_ENGINE_SUBSTITUTION"
)
_SETTINGS = (
    f"SET NAMES utf8mb4, SESSION sql_mode = '{SQL_MODE}', SESSION time_zone = '+00:00', "
    "SESSION sql_select_limit = 18446744073709551615, SESSION foreign_key_checks = 1, "
    "SESSION unique_checks = 1"
)
_MARIADB_SETTINGS = "SET SESSION check_constraint_checks = 1"  # MariaDB's own: CHECKs on
_UNKNOWN_THREAD = 1094  # ER_NO_SUCH_THREAD: the session is gone already
# The resolver is about to KILL the session that ran an epoch (after checking its mark).
KILLING = hooks.declare("sql.resolve.killing")


class SessionNotEndedError(sa.exc.SQLAlchemyError):
    """The old session still holds its mark after KILL: its outcome can still change."""


@dataclass(frozen=True)
class Session:
    """A server session that ran an epoch: its id, and the named lock only it holds."""

    id: int
    mark: str


def pin_settings(engine: sa.Engine) -> None:
    """Give every connection ``engine`` opens to MySQL or MariaDB the engine's session settings.

    Run first on each new connection, before SQLAlchemy's own first look at
    the server (which reads ``sql_mode`` to learn how to quote), and after the
    driver's ``init_command``, which it overrides.
    """
    if engine.dialect.name not in SESSION_DIALECTS:
        return

    def pin(dbapi_connection: Any, record: Any) -> None:
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(_SETTINGS)
            server = getattr(dbapi_connection, "get_server_info", lambda: "")()
            if "mariadb" in str(server).lower():
                cursor.execute(_MARIADB_SETTINGS)
        finally:
            cursor.close()

    sa.event.listen(engine, "connect", pin, insert=True)


def writer_mark(pipeline: str, sink: str, log_id: str | None) -> str:
    """The prefix of a writer's named lock; a session's is this and its id."""
    token = f"{pipeline}\0{sink}\0{log_id or ''}".encode()
    return f"rc:{hashlib.blake2b(token, digest_size=16).hexdigest()}:"


def mark_session(
    conn: sa.Connection, pipeline: str, sink: str, log_id: str | None
) -> Session | None:
    """Mark ``conn``'s server session as the writer's (once per session); None elsewhere.

    The writer is the sink of ``pipeline`` whose progress log is ``log_id``.

    Raises:
        sa.exc.SQLAlchemyError: the server cannot be reached, or refused the mark.
    """
    if conn.dialect.name not in SESSION_DIALECTS:
        return None
    info = conn.connection.info  # one per server session: cleared on reconnect
    key = ("reconcile.sql.mark", pipeline, sink, log_id)
    found = info.get(key)
    if isinstance(found, Session):
        return found
    own = f"rc:{secrets.token_hex(16)}"
    row = conn.execute(
        sa.text(
            "SELECT CONNECTION_ID(), GET_LOCK(:own, 0), GET_LOCK(CONCAT(:writer, "
            "CONNECTION_ID()), 0)"
        ),
        {"own": own, "writer": writer_mark(pipeline, sink, log_id)},
    ).one()
    if row[1] != 1:
        raise sa.exc.InvalidRequestError(f"the server refused this session's mark {own!r}")
    if row[2] != 1:
        # Only a session holding it already can refuse it: a takeover will not
        # find this one, which then waits out its locks (the fence still holds).
        log.warning("sql sink %r: session %s could not take its writer's mark", sink, row[0])
    session = Session(int(row[0]), own)
    info[key] = session
    return session


def _holds(conn: sa.Connection, session: Session) -> bool:
    """Whether ``session`` is still there: the named lock only it took is still its."""
    owner = conn.execute(sa.text("SELECT IS_USED_LOCK(:mark)"), {"mark": session.mark}).scalar()
    conn.rollback()
    return owner is not None and int(owner) == session.id


def _kill(conn: sa.Connection, session_id: int) -> None:
    try:
        conn.exec_driver_sql(f"KILL CONNECTION {int(session_id)}")
    except sa.exc.DBAPIError as err:
        # Gone already (it ended with its socket): nothing of it can change any more.
        if getattr(err.orig, "args", (None,))[0] != _UNKNOWN_THREAD:
            raise
    conn.rollback()


def end_session(engine: sa.Engine, session: Session, timeout_s: float = 30.0) -> None:
    """KILL ``session`` if it is still the one that ran the epoch; wait until its txn is over.

    Whether it still is, is read from its mark, not its id: after a server
    restart ids start again from 1, and the old id may name another
    client's session, which must live. A mark that is free means the session
    is gone (or ending, with its transaction rolled back already).

    Raises:
        SessionNotEndedError: it still holds its mark ``timeout_s`` after KILL.
        sa.exc.SQLAlchemyError: the server cannot be reached (or refused KILL).
    """
    with engine.connect() as conn:
        if not _holds(conn, session):
            return
        hooks.point(KILLING)
        _kill(conn, session.id)
        deadline = time.monotonic() + timeout_s
        while _holds(conn, session):
            if time.monotonic() > deadline:
                raise SessionNotEndedError(
                    f"session {session.id} is still running {timeout_s:.0f} s after KILL; "
                    "its transaction may still commit"
                )
            time.sleep(0.02)


def end_writer_sessions(
    engine: sa.Engine, writer: WriterIdentity, sink: str, wait_s: float = 5.0
) -> int:
    """End every session of ``writer``'s sink but the caller's; how many ended (a takeover's step).

    A session is the writer's when it is the same user's (the process list's
    USER) and holds the writer's mark with its own id in it. Each is ended in
    a try of its own, so that one that cannot be ended does not spare the
    others; a failure is logged, never raised: the fence still stops the old
    writer, only the new one's wait for its locks may then be longer.
    """
    prefix = writer_mark(writer.pipeline, sink, writer.log_id)
    with engine.connect() as conn:
        found = conn.execute(
            sa.text(
                "SELECT ID FROM information_schema.PROCESSLIST WHERE ID <> CONNECTION_ID() "
                "AND USER = SUBSTRING_INDEX(USER(), '@', 1) "
                "AND IS_USED_LOCK(CONCAT(:prefix, ID)) = ID"
            ),
            {"prefix": prefix},
        )
        ids = [int(row[0]) for row in found]
    ended = 0
    for session_id in ids:
        session = Session(session_id, f"{prefix}{session_id}")
        try:
            # A connection each: one that a failure took down spares no other session.
            with engine.connect() as conn:
                # Found by its mark a moment ago: its id cannot name another
                # session before a restart, which would end this connection too.
                _kill(conn, session_id)
                deadline = time.monotonic() + wait_s
                while (still := _holds(conn, session)) and time.monotonic() < deadline:
                    time.sleep(0.02)
            ended += 0 if still else 1
        except sa.exc.SQLAlchemyError as err:
            log.warning("sql sink %r: could not end the old session %d: %s", sink, session_id,
                        getattr(err, "orig", None) or type(err).__name__)  # fmt: skip
    return ended
