"""The ambiguous-commit decision table, case by case, against a real server; and what decided."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import psycopg
import pytest

from reconcile.core.contract import MarkerMismatchError, OutcomeUnknownError, SinkTxnId
from reconcile.demo.embedded_pg import as_postgres, pg_bindir, run_checked
from sinks.postgres.connection import PgTarget
from sinks.postgres.markers import StateTables
from sinks.postgres.ownership import Scope
from sinks.postgres.resolve import (
    BackendIdentity,
    Evidence,
    InFlightTxn,
    Resolution,
    Resolved,
    backend_identity,
    resolve_commit,
)
from tests.fix_pg import PASSWORD_USER, PgServer

pytestmark = pytest.mark.integration

TXN = SinkTxnId("pipe", "orders", 1, 0)
SCOPE = Scope("pipe", "orders", "public", "orders", "log-a")


@pytest.fixture
def target(pg_db: str) -> PgTarget:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        StateTables("public").create(conn)
    return PgTarget.parse(pg_db)


def insert_marker(
    conn: psycopg.Connection[Any], log_id: str = "log-a", table: str = "orders"
) -> None:
    conn.execute(
        "INSERT INTO public.reconcile_commits (pipeline, sink, epoch, target_schema, "
        "target_table, log_id, xid, backend_pid, generation, row_count) VALUES ('pipe', "
        "'orders', 1, 'public', %s, %s, pg_current_xact_id(), pg_backend_pid(), 0, 0)",
        (table, log_id),
    )


def finished_txn(dsn: str, *, commit: bool, marker: bool = False, **kw: str) -> InFlightTxn:
    """Run a txn to its end and describe it as if its COMMIT had had no reply."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        identity = backend_identity(conn)
        conn.autocommit = False
        row = conn.execute("SELECT pg_current_xact_id()::text").fetchone()
        assert row is not None
        if marker:
            insert_marker(conn, **kw)
        conn.commit() if commit else conn.rollback()
    return InFlightTxn(TXN, str(row[0]), identity)


def resolve(target: PgTarget, txn: InFlightTxn, timeout: float = 5) -> Resolved:
    return resolve_commit(target, StateTables("public"), txn, scope=SCOPE, timeout=timeout)


def test_committed_with_marker_is_decided_by_the_xid(target: PgTarget, pg_db: str) -> None:
    got = resolve(target, finished_txn(pg_db, commit=True, marker=True))
    assert got.resolution is Resolution.COMMITTED and got.decided_by is Evidence.XID_STATUS


def test_aborted_without_marker_is_aborted_by_the_xid(target: PgTarget, pg_db: str) -> None:
    got = resolve(target, finished_txn(pg_db, commit=False, marker=True))
    assert got.resolution is Resolution.ABORTED and got.decided_by is Evidence.XID_STATUS


def test_marker_of_another_attempt_settles_it(target: PgTarget, pg_db: str) -> None:
    ours = finished_txn(pg_db, commit=False)
    finished_txn(pg_db, commit=True, marker=True)  # another attempt committed the epoch
    got = resolve(target, ours)
    assert got.resolution is Resolution.COMMITTED and got.decided_by is Evidence.MARKER


def test_committed_without_marker_is_unknown(target: PgTarget, pg_db: str) -> None:
    # E.g. our xid was reused after a crash lost our commit: never guess.
    with pytest.raises(OutcomeUnknownError) as err:
        resolve(target, finished_txn(pg_db, commit=True))
    assert "pull-and-diff" in str(err.value) and "committed" in str(err.value)


def test_a_null_xid_status_without_a_marker_is_unknown_never_aborted(
    private_pg_server: PgServer,
) -> None:
    # pg_xact_status() is NULL for an xid older than the commit log still
    # holds (the server consumed 2**32 xids since, and vacuum truncated it).
    # pg_resetwal moves the server two xid epochs on: every xid of epoch 0 is
    # now that old, as on a server that ran for years after our COMMIT.
    server = private_pg_server
    server.shutdown()
    run_checked([*as_postgres(), str(pg_bindir() / "pg_resetwal"), "-e", "2", str(server.data)])
    server.start()
    dsn = server.dsn()
    with psycopg.connect(dsn, autocommit=True) as conn:
        StateTables("public").create(conn)
        old_xid = "1000"  # epoch 0, xid 1000: committed or not, the server no longer says
        assert conn.execute("SELECT pg_xact_status(%s::xid8)", (old_xid,)).fetchone() == (None,)
    target = PgTarget.parse(dsn)
    txn = dataclasses.replace(finished_txn(dsn, commit=False), xid=old_xid)
    with pytest.raises(OutcomeUnknownError) as err:
        resolve(target, txn)
    assert "pg_xact_status is NULL" in str(err.value) and "pull-and-diff" in str(err.value)
    # With the epoch's marker there, the marker settles it (committed), whatever the xid says.
    with psycopg.connect(dsn, autocommit=True) as conn:
        insert_marker(conn)
    got = resolve(target, txn)
    assert got.resolution is Resolution.COMMITTED and got.decided_by is Evidence.MARKER


def test_a_marker_of_another_state_is_a_mismatch_not_a_commit(target: PgTarget, pg_db: str) -> None:
    ours = finished_txn(pg_db, commit=False)
    finished_txn(pg_db, commit=True, marker=True, log_id="log-b")
    with pytest.raises(MarkerMismatchError) as err:
        resolve(target, ours)
    assert "'log-b'" in str(err.value) and "'log-a'" in str(err.value)
    assert "DELETE FROM" in str(err.value)


def test_future_xid_same_history_is_aborted_else_unknown(target: PgTarget, pg_db: str) -> None:
    txn = finished_txn(pg_db, commit=False)
    future = dataclasses.replace(txn, xid=str(int(txn.xid) + 10_000_000))
    got = resolve(target, future)
    assert got.resolution is Resolution.ABORTED and got.decided_by is Evidence.SERVER_HISTORY
    failover = dataclasses.replace(
        future, backend=dataclasses.replace(txn.backend, timeline="00000002")
    )
    with pytest.raises(OutcomeUnknownError) as err:
        resolve(target, failover)
    assert "future" in str(err.value)


def test_live_backend_is_terminated_then_the_txn_is_aborted(target: PgTarget, pg_db: str) -> None:
    conn: psycopg.Connection[Any] = psycopg.connect(pg_db, autocommit=True)
    identity = backend_identity(conn)
    conn.autocommit = False
    row = conn.execute("SELECT pg_current_xact_id()::text").fetchone()
    assert row is not None
    # The client lost the connection but the backend lives on, txn open.
    got = resolve(target, InFlightTxn(TXN, str(row[0]), identity))
    assert got.resolution is Resolution.ABORTED and got.decided_by is Evidence.XID_STATUS
    with pytest.raises(psycopg.OperationalError):
        conn.execute("SELECT 1")
    conn.close()


def test_a_pooled_backend_now_serving_another_client_is_not_terminated(
    target: PgTarget, pg_db: str
) -> None:
    # Behind a pooler one server backend serves many clients: (pid, start time)
    # still names it after our txn ended, while it runs someone else's.
    shared: psycopg.Connection[Any] = psycopg.connect(pg_db, autocommit=True)
    identity = backend_identity(shared)
    shared.autocommit = False
    ours = shared.execute("SELECT pg_current_xact_id()::text").fetchone()
    assert ours is not None
    shared.rollback()  # our txn ended (the pooler saw the client go)
    theirs = shared.execute("SELECT pg_current_xact_id()::text").fetchone()  # another client
    assert theirs is not None and theirs != ours
    got = resolve(target, InFlightTxn(TXN, str(ours[0]), identity))
    assert got.resolution is Resolution.ABORTED
    # The other client's transaction is untouched.
    assert shared.execute("SELECT pg_current_xact_id()::text").fetchone() == theirs
    shared.commit()
    shared.close()


def test_in_progress_of_a_stranger_is_unknown_after_the_timeout(
    target: PgTarget, pg_db: str
) -> None:
    with psycopg.connect(pg_db) as other:
        row = other.execute("SELECT pg_current_xact_id()::text").fetchone()
        assert row is not None
        # The recorded backend is not this one (pid reuse must not kill it).
        mine = finished_txn(pg_db, commit=False)
        stranger = dataclasses.replace(mine, xid=str(row[0]))
        with pytest.raises(OutcomeUnknownError) as err:
            resolve(target, stranger, timeout=0.5)
        assert "in progress" in str(err.value)
        assert other.execute("SELECT 1").fetchone() == (1,)  # not terminated
        other.rollback()


def test_unreachable_server_is_unknown() -> None:
    target = PgTarget.parse("host=127.0.0.1 port=1 dbname=x user=u password=hunter2")
    txn = InFlightTxn(TXN, "1000", BackendIdentity(1, None, None, None))
    with pytest.raises(OutcomeUnknownError) as err:
        resolve(target, txn, timeout=0.3)
    assert "cannot reach" in str(err.value) and "hunter2" not in str(err.value)


def test_wrong_password_is_unknown_at_once_and_redacted(pg_server: PgServer) -> None:
    target = PgTarget.parse(pg_server.dsn(user=PASSWORD_USER, password="Wr0ngPassw0rd"))
    txn = InFlightTxn(TXN, "1000", BackendIdentity(1, None, None, None))
    started = time.monotonic()
    with pytest.raises(OutcomeUnknownError) as err:
        # Wrong credentials do not heal: it gives up at once, not after the timeout.
        resolve(target, txn, timeout=120)
    assert time.monotonic() - started < 60
    assert "password authentication failed" in str(err.value)
    assert "Wr0ngPassw0rd" not in str(err.value)
