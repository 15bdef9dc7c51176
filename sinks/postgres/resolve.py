"""Ambiguous-commit resolution: ask the database (pg_xact_status, then the marker), never guess.

The answer says what decided it (:class:`Evidence`): the xid's status in the
commit log, the marker row, the prepared-transaction list, or the server's
history (same system and timeline: a restart that lost our WAL).
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import errors, sql

from reconcile.core import hooks
from reconcile.core.contract import ConfigurationError, OutcomeUnknownError, SinkTxnId
from reconcile.core.metrics import record_ambiguous_commit

from .connection import PgTarget, connect_failure
from .markers import StateTables
from .ownership import Scope, check_marker
from .replication import confirm_replicated

__all__ = [
    "RESOLVING",
    "XID_IN_PROGRESS",
    "BackendIdentity",
    "Evidence",
    "InFlightTxn",
    "Resolution",
    "Resolved",
    "backend_identity",
    "resolve_commit",
]

log = logging.getLogger("reconcile.sinks.postgres")

# Hit each time the resolver finds the xid still in progress and waits: a test
# finishes (or unblocks) the old transaction here, after the resolver has
# looked and before it looks again.
XID_IN_PROGRESS = hooks.declare("pg.resolve.xid_in_progress")
# Hit once the resolver is connected, before it looks at the old backend: a test
# lets the old backend reach the state it means to test (e.g. a replication wait).
RESOLVING = hooks.declare("pg.resolve.connected")

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


class Evidence(enum.Enum):
    """What settled a resolution."""

    XID_STATUS = "pg_xact_status"  # the commit log's answer for our own xid
    MARKER = "marker"  # the epoch's marker row (another attempt committed it)
    PREPARED_XACTS = "pg_prepared_xacts"  # the gid is still prepared
    SERVER_HISTORY = "server history"  # xid in the future on the same system and timeline


@dataclass(frozen=True)
class Resolved:
    """A resolution and the evidence that decided it."""

    resolution: Resolution
    decided_by: Evidence
    detail: str


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
            failure = connect_failure(target, err, "resolving an ambiguous COMMIT")
            # Wrong credentials do not heal while we wait; a restarting server may.
            if isinstance(failure, ConfigurationError) or time.monotonic() + delay > deadline:
                raise OutcomeUnknownError(
                    f"cannot reach {target.describe()} to resolve an ambiguous COMMIT: {failure}"
                ) from None
            time.sleep(delay)
            delay = min(delay * 2, 1.0)


def _old_backend(conn: psycopg.Connection[Any], txn: InFlightTxn) -> str | None:
    """The wait event of the backend that still runs our txn ('' if not waiting), else None.

    (pid, start time) alone is not enough: behind a pooler one server backend
    serves many clients, so it must also still hold our transaction: our xid
    (transactional mode), or our COMMIT PREPARED (prepared mode, where the
    prepared txn's xid belongs to no backend).
    """
    if txn.gid is None:
        row = conn.execute(
            "SELECT coalesce(wait_event, '') FROM pg_stat_get_activity(%s) "
            "WHERE backend_start = %s AND backend_xid = xid(%s::xid8)",
            (txn.backend.pid, txn.backend.backend_start, txn.xid),
        ).fetchone()
    else:
        statement = sql.SQL("COMMIT PREPARED {}").format(sql.Literal(txn.gid)).as_string(conn)
        row = conn.execute(
            "SELECT coalesce(wait_event, '') FROM pg_stat_get_activity(%s) "
            "WHERE backend_start = %s AND state = 'active' AND query = %s",
            (txn.backend.pid, txn.backend.backend_start, statement),
        ).fetchone()
    return None if row is None else str(row[0])


def resolve_commit(
    target: PgTarget,
    state: StateTables,
    txn: InFlightTxn,
    *,
    scope: Scope,
    timeout: float,
    app: str = "reconcile-resolve",
    evidence: Callable[[psycopg.Connection[Any]], tuple[bool, bool]] | None = None,
) -> Resolved:
    """Settle a COMMIT (or COMMIT PREPARED) whose outcome we did not see.

    Args:
        target: where to connect (a fresh connection is used).
        state: the marker table.
        txn: the txn id, its xid and the backend that ran it.
        scope: the writer's target and progress log, which a marker must match.
        timeout: seconds to keep trying to reach the server, to wait for an
            in-progress txn to finish, and for synchronous standbys to confirm.
        evidence: what stands in for the epoch's marker, for a txn that is not
            an epoch's (a repair): returns (our txn's own row is there, a row of
            any attempt is there). Default: the epoch's marker.

    Returns:
        COMMITTED, ABORTED, or PREPARED (prepared mode, still prepared), with
        the evidence that decided it.

    Raises:
        OutcomeUnknownError: when neither the xid status nor the marker can
            settle it (the epoch then goes to pull-and-diff), or when it is
            committed but the synchronous standbys do not confirm it in time.
        MarkerMismatchError: the epoch's marker belongs to another target or
            progress log.
    """
    deadline = time.monotonic() + timeout
    pipeline, sink, epoch = txn.txn_id.key
    describe = f"{txn.txn_id} (xid {txn.xid}, backend pid {txn.backend.pid})"
    conn = _connect_until(target, deadline, app)
    try:
        hooks.point(RESOLVING)
        # Case 1: the old backend still runs our txn (it has not noticed that
        # its client went away, or it is still committing). While it lives the
        # txn may still end either way, so end it: terminating a backend rolls
        # back an uncommitted txn and cannot undo a committed one. Except in a
        # synchronous-replication wait: the commit is already in the primary's
        # WAL, and terminating would cut the wait short and leave it on the
        # primary only (a failover would lose it). That backend is waited for.
        waiting = _old_backend(conn, txn)
        if waiting == "SyncRep":
            log.warning(
                "backend %s that ran %s waits for a synchronous standby", txn.backend.pid, describe
            )
        elif waiting is not None:
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
                record_ambiguous_commit(pipeline, sink, "prepared", Evidence.PREPARED_XACTS.value)
                return Resolved(
                    Resolution.PREPARED, Evidence.PREPARED_XACTS, f"{txn.gid} is still prepared"
                )
            status, future = _xact_status(conn, txn.xid, deadline, prepared=False)
        if evidence is not None:
            ours, anyone = evidence(conn)
        else:
            marker = state.find_marker(conn, pipeline, sink, epoch)
            if marker is not None:
                mismatch = check_marker(marker, scope, state, where="resolving the COMMIT")
                if mismatch is not None:
                    raise mismatch
            ours, anyone = marker is not None and marker.xid == txn.xid, marker is not None
        resolved = _decide(conn, txn, status, future, ours, anyone)
        if resolved is None:
            # Case 6, never guessed:
            #  - "committed" without our marker: the xid was reused after a crash
            #    lost our commit, or the marker was deleted; we cannot tell which;
            #  - NULL: the xid is too old for the commit log and no marker is there;
            #  - "in the future" after a failover: the old primary may have had it;
            #  - still "in progress" after the timeout (e.g. a synchronous standby
            #    that does not answer).
            syncrep = (
                " Its backend is still waiting for the synchronous standby, and is not "
                "terminated: that would cut the wait and leave the commit on the primary only. "
                "When the standby is back, a restart settles it"
                if waiting == "SyncRep"
                else ""
            )
            record_ambiguous_commit(pipeline, sink, "unknown", "none")
            raise OutcomeUnknownError(
                f"postgres sink {sink!r}: cannot resolve the COMMIT of {describe}: "
                f"pg_xact_status is {status or 'NULL'}{' (xid in the future)' if future else ''} "
                f"and there is no marker in {state.display()}; reconcile the epoch with "
                f"pull-and-diff.{syncrep}",
                txn_id=str(txn.txn_id),
                xid=txn.xid,
                status=status,
            )
        if resolved.resolution is Resolution.COMMITTED:
            # Committed on this server; say so only once the synchronous
            # standbys (if any) hold it too.
            confirm_replicated(
                conn,
                timeout_s=max(deadline - time.monotonic(), 1.0),
                what=f"postgres sink {sink!r}: COMMIT of {describe}",
            )
        log.warning(
            "COMMIT of %s resolved as %s, decided by %s: %s",
            describe,
            resolved.resolution.value,
            resolved.decided_by.value,
            resolved.detail,
            extra={"xid": txn.xid},
        )
        record_ambiguous_commit(
            pipeline, sink, resolved.resolution.value, resolved.decided_by.value
        )
        return resolved
    finally:
        conn.close()


def _decide(
    conn: psycopg.Connection[Any],
    txn: InFlightTxn,
    status: str | None,
    future: bool,
    our_marker: bool,
    any_marker: bool,
) -> Resolved | None:
    """The decision table (see docs/postgres.md); None: nothing settles it."""
    if status == "committed" and our_marker:
        # Case 3: our own xid committed, and the marker it carried is there.
        return Resolved(Resolution.COMMITTED, Evidence.XID_STATUS, "xid committed, marker confirms")
    if any_marker:
        # Case 4: the marker commits atomically with the data and is unique
        # per (pipeline, sink, epoch): another attempt committed the epoch.
        return Resolved(
            Resolution.COMMITTED,
            Evidence.MARKER,
            f"another attempt's marker is there (our xid is {status or 'NULL'})",
        )
    if status == "aborted":
        # Case 5: our txn carried the marker; aborted means none of it is
        # visible, and it can never commit now.
        return Resolved(Resolution.ABORTED, Evidence.XID_STATUS, "xid aborted, no marker")
    if future and _same_history(conn, txn):
        # Case 6: the xid is "in the future" on the same server history (same
        # system id and timeline): the server restarted without any WAL of
        # our txn, so its commit record was never durable.
        return Resolved(
            Resolution.ABORTED,
            Evidence.SERVER_HISTORY,
            "xid in the future on the same system and timeline: restarted without our WAL",
        )
    return None


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
        hooks.point(XID_IN_PROGRESS)
        time.sleep(0.05)


def _same_history(conn: psycopg.Connection[Any], txn: InFlightTxn) -> bool:
    if txn.backend.system_id is None:
        return False
    try:
        now = backend_identity(conn)
    except psycopg.Error:
        return False
    return (now.system_id, now.timeline) == (txn.backend.system_id, txn.backend.timeline)
