"""One repair of a Postgres table at a time: its turn, held from before the pull until the end.

Two repairs of one table started together each pulled the same drift and each
applied all of it: the table ended exact, but both reported the whole
difference as repaired and both recorded it in ``reconcile_repairs``. A
repair (an operator's ``reconcile repair``, ``recover()``, a pipeline's
recovery at start-up, ``repair --spark``'s driver) now takes the table's turn
first: a session-level advisory lock, keyed by the table's oid, on a session
of its own that it holds until the repair has committed or given up. The
second waits for it BEFORE it pulls, so it diffs what the first left (nothing,
when the first repaired everything) and its report says that it waited, and
for whom. A verify takes no turn: it writes nothing.

Why a session lock on a session of its own, and not a lock inside the repair's
transaction: the drift is found before that transaction begins (the pull is
another snapshot), so a lock taken there would serialise the writes of two
repairs but not what each found to write.

The lock dies with its session: a repair killed with ``kill -9`` frees the table
when the server notices the closed connection. A wait is bounded by the sink's
statement timeout (15 minutes unless set); past it the repair stops with a
RetryableError naming the session that holds the table, having pulled nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

import psycopg
from psycopg import errors

from reconcile.core import hooks
from reconcile.core.contract import RetryableError
from reconcile.core.target import RepairTurn

from .binding import connect_checked
from .connection import PgTarget
from .schema import TableSchema

__all__ = ["REPAIR_TURN_WAITING", "TURN_KEY_SPACE", "repair_turn", "turn_key"]

log = logging.getLogger("reconcile.recovery")

# Another repair holds the table: this one is about to wait for it.
REPAIR_TURN_WAITING = hooks.declare("pg.repair_turn.waiting")

# The advisory lock's key: the table's oid in the low 32 bits, "reco" in the
# high ones, so that it meets no lock keyed by a bare oid or a small number.
# pg_locks shows the two halves as classid and objid (objsubid 1).
TURN_KEY_SPACE = int.from_bytes(b"reco", "big")
_KEY = (
    "SELECT (%s::bigint << 32) | c.oid::bigint FROM pg_catalog.pg_class c "
    "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
    "WHERE n.nspname = %s AND c.relname = %s"
)
_HOLDER = (
    "SELECT l.pid, a.application_name FROM pg_catalog.pg_locks l "
    "LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid "
    "WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 "
    "AND l.database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = current_database()) "
    "AND l.classid = %s::bigint::oid AND l.objid = %s::bigint::oid"
)


def turn_key(conn: psycopg.Connection[Any], schema: str, table: str) -> int:
    """The advisory lock key of ``schema.table``'s repair turn (the table must exist)."""
    row = conn.execute(_KEY, (TURN_KEY_SPACE, schema, table)).fetchone()
    if row is None:
        raise LookupError(f"no table {schema}.{table}")
    return int(row[0])


def _holder(conn: psycopg.Connection[Any], key: int) -> str:
    row = conn.execute(_HOLDER, (key >> 32, key & 0xFFFFFFFF)).fetchone()
    if row is None:
        return "a session that has just let go of it"
    return f"backend pid {row[0]}" + (f" ({row[1]})" if row[1] else "")


def _take(conn: psycopg.Connection[Any], table: TableSchema, wait_ms: int) -> RepairTurn:
    """Take the table's turn on ``conn``, waiting for the repair that holds it, if one does."""
    # The wait is this session's only statement that can block: the role's
    # statement timeout is not ours to take; the bound is wait_ms.
    conn.execute(
        "SELECT pg_catalog.set_config('statement_timeout', '0', false), "
        "pg_catalog.set_config('lock_timeout', %s, false)",
        (str(max(1, wait_ms)),),
    )
    key = turn_key(conn, table.schema, table.table)  # reflected by this target: it exists
    got = conn.execute("SELECT pg_catalog.pg_try_advisory_lock(%s)", (key,)).fetchone()
    if got and got[0]:
        return RepairTurn()
    holder = _holder(conn, key)
    log.warning("repair of %s: waiting for another repair of it to finish (%s)",
                table.display, holder)  # fmt: skip
    hooks.point(REPAIR_TURN_WAITING)
    began = time.monotonic()
    try:
        conn.execute("SELECT pg_catalog.pg_advisory_lock(%s)", (key,))
    except errors.LockNotAvailable:
        raise RetryableError(
            f"repair of {table.display}: another repair of it ({holder}) held it for more "
            f"than {wait_ms / 1000:g} s; nothing was pulled or written, run it again"
        ) from None
    return RepairTurn(waited_s=round(time.monotonic() - began, 3), holder=holder)


@contextmanager
def repair_turn(
    target: PgTarget, table: TableSchema, *, app: str, wait_ms: int
) -> Iterator[RepairTurn]:
    """Hold ``table``'s repair turn for the block; wait for another repair that holds it.

    Args:
        target: where the table is.
        table: the reflected table.
        app: the turn's session's application_name.
        wait_ms: the longest wait for another repair.

    Raises:
        RetryableError: another repair held the table for longer than
            ``wait_ms`` (naming its session), or the server cannot be reached.
        ConfigurationError: from connecting (wrong password, no such database).
    """
    conn = connect_checked(target, f"repair of {table.display}", f"{app}-turn")
    try:
        try:
            turn = _take(conn, table, wait_ms)
        except psycopg.OperationalError as err:
            raise RetryableError(
                target.redact(f"repair of {table.display}: cannot take its turn: {err}")
            ) from None
        yield turn
    finally:
        # Closing the session lets go of the lock (and of a wait still queued).
        with suppress(psycopg.Error):
            conn.close()
