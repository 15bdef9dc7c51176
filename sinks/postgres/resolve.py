"""Ambiguous-commit resolution: ask the database (pg_xact_status, then the marker), never guess."""

from __future__ import annotations

import enum
import logging
import time
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import errors

from reconcile.contract import OutcomeUnknownError, SinkTxnId

from .connection import PgTarget
from .markers import StateTables

__all__ = ["BackendIdentity", "InFlightTxn", "Resolution", "backend_identity", "resolve_commit"]

log = logging.getLogger("reconcile.sinks.postgres")

_IDENTITY_SQL = (
    "SELECT pg_backend_pid(), "
    "(SELECT backend_start FROM pg_stat_get_activity(pg_backend_pid())), "
    "(SELECT system_identifier FROM pg_control_system()), "
    "substr(pg_walfile_name(pg_current_wal_insert_lsn()), 1, 8)"
)


class Resolution(enum.Enum):
    """What the database says about a txn whose COMMIT had no reply."""

    COMMITTED = "committed"  # the epoch is in the sink, exactly once
    ABORTED = "aborted"  # nothing of the epoch is visible; retry it
    PREPARED = "prepared"  # prepared mode: still prepared; COMMIT PREPARED again


@dataclass(frozen=True)
class BackendIdentity:
    """Which server process ran a txn, and which server history it ran on."""

    pid: int
    backend_start: Any  # datetime; (pid, start) cannot be reused by another backend
    system_id: int | None  # pg_control_system().system_identifier
    timeline: str | None  # the WAL timeline; a failover or PITR changes it


@dataclass(frozen=True)
class InFlightTxn:
    """What we recorded about an epoch txn before sending its COMMIT."""

    txn_id: SinkTxnId
    xid: str
    backend: BackendIdentity
    gid: str | None = None  # prepared mode: the prepared txn's gid


def backend_identity(conn: psycopg.Connection[Any]) -> BackendIdentity:
    """Identify the backend of ``conn`` (one query, once per connection)."""
    try:
        row = conn.execute(_IDENTITY_SQL).fetchone()
        assert row is not None
        return BackendIdentity(int(row[0]), row[1], int(row[2]), str(row[3]))
    except psycopg.errors.InsufficientPrivilege:
        # pg_control_system() may be restricted; without it a "future" xid
        # cannot be told apart from a failover, so it resolves by marker only.
        conn.rollback()
        row = conn.execute(
            "SELECT pg_backend_pid(), "
            "(SELECT backend_start FROM pg_stat_get_activity(pg_backend_pid()))"
        ).fetchone()
        assert row is not None
        return BackendIdentity(int(row[0]), row[1], None, None)


def _connect_until(target: PgTarget, deadline: float, app: str) -> psycopg.Connection[Any]:
    """A fresh autocommit connection, retried until ``deadline`` (the server may be restarting)."""
    delay = 0.05
    while True:
        try:
            return target.connect(autocommit=True, application_name=app, connect_timeout=5)
        except psycopg.OperationalError as err:
            if time.monotonic() + delay > deadline:
                raise OutcomeUnknownError(
                    f"cannot reach {target.describe()} to resolve an ambiguous COMMIT: "
                    f"{target.redact(str(err))}"
                ) from None
            time.sleep(delay)
            delay = min(delay * 2, 1.0)


def resolve_commit(
    target: PgTarget,
    state: StateTables,
    txn: InFlightTxn,
    *,
    timeout: float,
    app: str = "reconcile-resolve",
) -> Resolution:
    """Settle a COMMIT (or COMMIT PREPARED) whose outcome we did not see.

    Args:
        target: where to connect (a fresh connection is used).
        state: the marker table.
        txn: the txn id, its xid and the backend that ran it.
        timeout: seconds to keep trying to reach the server and to wait for an
            in-progress txn to finish.

    Returns:
        COMMITTED, ABORTED, or PREPARED (prepared mode, still prepared).

    Raises:
        OutcomeUnknownError: when neither the xid status nor the marker can
            settle it; the epoch then goes to pull-and-diff.
    """
    deadline = time.monotonic() + timeout
    pipeline, sink, epoch = txn.txn_id.key
    describe = f"{txn.txn_id} (xid {txn.xid}, backend pid {txn.backend.pid})"
    conn = _connect_until(target, deadline, app)
    try:
        # Case 1: the old backend is still alive (it has not noticed that its
        # client went away, or it is still committing). While it lives the txn
        # may still end either way, so end it: terminating a backend rolls back
        # an uncommitted txn and cannot undo a committed one. (pid, start time)
        # is checked so that a reused pid never makes us kill a stranger.
        alive = conn.execute(
            "SELECT 1 FROM pg_stat_get_activity(%s) WHERE backend_start = %s",
            (txn.backend.pid, txn.backend.backend_start),
        ).fetchone()
        if alive is not None:
            log.warning("terminating backend %s that ran %s", txn.backend.pid, describe)
            conn.execute("SELECT pg_terminate_backend(%s, 5000)", (txn.backend.pid,))

        status, future = _xact_status(conn, txn.xid, deadline, prepared=txn.gid is not None)
        if txn.gid is not None and status == "in progress":
            # Case 2 (prepared mode): a prepared txn reports "in progress"
            # until COMMIT/ROLLBACK PREPARED. If the gid is still listed the
            # commit did not happen: the caller commits it again.
            listed = conn.execute(
                "SELECT 1 FROM pg_prepared_xacts WHERE gid = %s AND database = current_database()",
                (txn.gid,),
            ).fetchone()
            if listed is not None:
                return Resolution.PREPARED
            status, future = _xact_status(conn, txn.xid, deadline, prepared=False)
        marker = state.find_marker(conn, pipeline, sink, epoch)
        if marker is not None:
            # Case 3: the marker commits atomically with the data and is unique
            # per (pipeline, sink, epoch): if it is there, the epoch is in the
            # sink exactly once, whichever attempt wrote it.
            if marker.xid != txn.xid:
                log.info("epoch %s was committed by xid %s, not %s", describe, marker.xid, txn.xid)
            return Resolution.COMMITTED
        if status == "aborted":
            # Case 4: our txn carried the marker; aborted means none of it is
            # visible, and it can never commit now.
            return Resolution.ABORTED
        if future and _same_history(conn, txn):
            # Case 5: the xid is "in the future" on the same server history
            # (same system id and timeline): the server restarted without any
            # WAL of our txn, so its commit record was never durable.
            return Resolution.ABORTED
        # Case 6, never guessed:
        #  - "committed" without our marker: the xid was reused after a crash
        #    lost our commit, or the marker was deleted; we cannot tell which;
        #  - NULL: the xid is too old for the commit log and no marker is there;
        #  - "in the future" after a failover: the old primary may have had it;
        #  - still "in progress" after the timeout.
        raise OutcomeUnknownError(
            f"postgres sink {sink!r}: cannot resolve the COMMIT of {describe}: "
            f"pg_xact_status is {status or 'NULL'}{' (xid in the future)' if future else ''} "
            f"and there is no marker in {state.schema}.reconcile_commits; reconcile the "
            "epoch with pull-and-diff",
            txn_id=str(txn.txn_id),
            xid=txn.xid,
            status=status,
        )
    finally:
        conn.close()


def _xact_status(
    conn: psycopg.Connection[Any], xid: str, deadline: float, *, prepared: bool
) -> tuple[str | None, bool]:
    """pg_xact_status(xid), waiting while it is "in progress"; (status, xid is in the future)."""
    while True:
        try:
            row = conn.execute("SELECT pg_xact_status(%s::xid8)", (xid,)).fetchone()
        except (errors.InvalidParameterValue, errors.ObjectNotInPrerequisiteState) as err:
            if "future" in str(err):
                return None, True
            return None, False
        status = None if row is None else row[0]
        if status != "in progress" or prepared or time.monotonic() > deadline:
            return status, False
        time.sleep(0.05)


def _same_history(conn: psycopg.Connection[Any], txn: InFlightTxn) -> bool:
    if txn.backend.system_id is None:
        return False
    try:
        now = backend_identity(conn)
    except psycopg.Error:
        return False
    return (now.system_id, now.timeline) == (txn.backend.system_id, txn.backend.timeline)
