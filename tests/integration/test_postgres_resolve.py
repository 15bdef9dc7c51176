"""The ambiguous-commit decision table, case by case, against a real server."""

from __future__ import annotations

import dataclasses
from typing import Any

import psycopg
import pytest

from reconcile.contract import OutcomeUnknownError, SinkTxnId
from sinks.postgres.connection import PgTarget
from sinks.postgres.markers import StateTables
from sinks.postgres.resolve import (
    BackendIdentity,
    InFlightTxn,
    Resolution,
    backend_identity,
    resolve_commit,
)

pytestmark = pytest.mark.integration

TXN = SinkTxnId("pipe", "orders", 1, 0)


@pytest.fixture
def target(pg_db: str) -> PgTarget:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        StateTables("public").create(conn)
    return PgTarget.parse(pg_db)


def finished_txn(dsn: str, *, commit: bool, marker: bool = False) -> InFlightTxn:
    """Run a txn to its end and describe it as if its COMMIT had had no reply."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        identity = backend_identity(conn)
        conn.autocommit = False
        row = conn.execute("SELECT pg_current_xact_id()::text").fetchone()
        assert row is not None
        if marker:
            conn.execute(
                "INSERT INTO reconcile_commits (pipeline, sink, epoch, xid, backend_pid, "
                "generation, row_count) VALUES ('pipe', 'orders', 1, pg_current_xact_id(), "
                "pg_backend_pid(), 0, 0)"
            )
        conn.commit() if commit else conn.rollback()
    return InFlightTxn(TXN, str(row[0]), identity)


def resolve(target: PgTarget, txn: InFlightTxn, timeout: float = 5) -> Resolution:
    return resolve_commit(target, StateTables("public"), txn, timeout=timeout)


def test_committed_with_marker_is_committed(target: PgTarget, pg_db: str) -> None:
    assert resolve(target, finished_txn(pg_db, commit=True, marker=True)) is Resolution.COMMITTED


def test_aborted_without_marker_is_aborted(target: PgTarget, pg_db: str) -> None:
    assert resolve(target, finished_txn(pg_db, commit=False, marker=True)) is Resolution.ABORTED


def test_marker_of_another_attempt_settles_it(target: PgTarget, pg_db: str) -> None:
    ours = finished_txn(pg_db, commit=False)
    finished_txn(pg_db, commit=True, marker=True)  # another attempt committed the epoch
    assert resolve(target, ours) is Resolution.COMMITTED


def test_committed_without_marker_is_unknown(target: PgTarget, pg_db: str) -> None:
    # E.g. our xid was reused after a crash lost our commit: never guess.
    with pytest.raises(OutcomeUnknownError) as err:
        resolve(target, finished_txn(pg_db, commit=True))
    assert "pull-and-diff" in str(err.value) and "committed" in str(err.value)


def test_future_xid_same_history_is_aborted_else_unknown(target: PgTarget, pg_db: str) -> None:
    txn = finished_txn(pg_db, commit=False)
    future = dataclasses.replace(txn, xid=str(int(txn.xid) + 10_000_000))
    assert resolve(target, future) is Resolution.ABORTED
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
    assert resolve(target, InFlightTxn(TXN, str(row[0]), identity)) is Resolution.ABORTED
    with pytest.raises(psycopg.OperationalError):
        conn.execute("SELECT 1")
    conn.close()


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
