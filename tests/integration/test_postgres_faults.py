"""Postgres sink under faults: lost COMMIT replies, killed backends and servers, timeouts."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import psycopg
import pytest

from reconcile.core.contract import OK, Retryable, SinkOutcome, SinkTxnId
from reconcile.testing.pg_proxy import DROP_AFTER_COMMIT, DROP_BEFORE_COMMIT, FaultProxy
from sinks.postgres.resolve import Evidence, Resolution
from sinks.postgres.sink import PostgresSink
from tests.fix_pg import PgServer

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

PIPE = "pipe"


def txn(epoch: int) -> SinkTxnId:
    return SinkTxnId(PIPE, "orders", epoch, 0)


def rows(epoch: int) -> list[dict[str, Any]]:
    return [{"k": f"e{epoch}-r{i}", "v": epoch * 1000 + i} for i in range(3)]


def setup_db(server: PgServer) -> str:
    name = server.create_database()
    with server.connect(name) as conn:
        conn.execute("CREATE TABLE orders (k text PRIMARY KEY, v bigint, _epoch bigint)")
    return name


def committed(dsn: str) -> dict[int, list[tuple[str, int]]]:
    """Epoch -> rows, read directly; also checks one marker per epoch that has rows."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        got: dict[int, list[tuple[str, int]]] = {}
        for k, v, epoch in conn.execute("SELECT k, v, _epoch FROM orders ORDER BY k"):
            got.setdefault(epoch, []).append((k, v))
        markers = [r[0] for r in conn.execute("SELECT epoch FROM reconcile.reconcile_commits")]
    assert sorted(markers) == sorted(set(markers))
    assert set(got) <= set(markers), "rows without a marker"
    return got


def expect_exactly(dsn: str, epochs: list[int]) -> None:
    assert committed(dsn) == {e: [(r["k"], r["v"]) for r in rows(e)] for e in epochs}


def run(sink: PostgresSink, epoch: int) -> None:
    assert sink.stage(txn(epoch), rows(epoch)) == OK
    assert sink.prepare(txn(epoch)) == OK
    assert sink.commit(txn(epoch)) == OK


@pytest.fixture
def proxy(pg_server: PgServer) -> Iterator[FaultProxy]:
    p = FaultProxy(pg_server.port)
    yield p
    p.close()


def test_commit_reply_lost_is_resolved_as_committed(pg_server: PgServer, proxy: FaultProxy) -> None:
    db = setup_db(pg_server)
    sink = PostgresSink(pg_server.dsn(db, port=proxy.port), "orders", name="orders", pipeline=PIPE)
    run(sink, 1)
    assert sink.stage(txn(2), rows(2)) == OK
    assert sink.prepare(txn(2)) == OK
    proxy.arm(DROP_AFTER_COMMIT)
    # The server commits, the reply is lost: pg_xact_status says committed and
    # the marker confirms it, so commit() is OK without a second write.
    assert sink.commit(txn(2)) == OK
    assert proxy.fired.is_set()
    # The xid's own status decided; the marker only confirmed it.
    assert sink.last_resolution is not None
    assert sink.last_resolution.resolution is Resolution.COMMITTED
    assert sink.last_resolution.decided_by is Evidence.XID_STATUS
    expect_exactly(pg_server.dsn(db), [1, 2])
    # The coordinator may retry the commit, or replay the epoch: still once.
    assert sink.commit(txn(2)) == OK
    run(sink, 2)
    run(sink, 3)
    expect_exactly(pg_server.dsn(db), [1, 2, 3])


def test_commit_never_sent_is_resolved_as_aborted(pg_server: PgServer, proxy: FaultProxy) -> None:
    db = setup_db(pg_server)
    sink = PostgresSink(pg_server.dsn(db, port=proxy.port), "orders", name="orders", pipeline=PIPE)
    run(sink, 1)
    assert sink.stage(txn(2), rows(2)) == OK
    assert sink.prepare(txn(2)) == OK
    proxy.arm(DROP_BEFORE_COMMIT)
    outcome = sink.commit(txn(2))
    assert proxy.fired.is_set()
    assert isinstance(outcome, Retryable) and "did not take effect" in outcome.reason
    assert sink.last_resolution is not None
    assert sink.last_resolution.resolution is Resolution.ABORTED
    assert sink.last_resolution.decided_by is Evidence.XID_STATUS
    expect_exactly(pg_server.dsn(db), [1])
    # Retry of the same epoch (the rows are still staged).
    assert sink.prepare(txn(2)) == OK
    assert sink.commit(txn(2)) == OK
    expect_exactly(pg_server.dsn(db), [1, 2])


def _blocked_prepare(
    server: PgServer, db: str, sink: PostgresSink, epoch: int
) -> tuple[psycopg.Connection[Any], Future[SinkOutcome], int, ThreadPoolExecutor]:
    """Start prepare(epoch) in a thread and wait until its apply waits on a table lock."""
    locker = server.connect(db, autocommit=False)
    locker.execute("LOCK TABLE orders IN ACCESS EXCLUSIVE MODE")
    assert sink.stage(txn(epoch), rows(epoch)) == OK
    pool = ThreadPoolExecutor(1)
    future = pool.submit(sink.prepare, txn(epoch))
    deadline = time.monotonic() + 30
    with server.connect(db) as watcher:
        while True:
            row = watcher.execute(
                "SELECT pid FROM pg_stat_activity WHERE application_name = %s "
                "AND wait_event_type = 'Lock'",
                (sink.application_name,),
            ).fetchone()
            if row is not None:
                return locker, future, int(row[0]), pool
            assert time.monotonic() < deadline, "the sink's apply never reached the lock"
            assert not future.done(), future.result()
            time.sleep(0.02)


def test_backend_terminated_during_apply(pg_server: PgServer) -> None:
    db = setup_db(pg_server)
    sink = PostgresSink(pg_server.dsn(db), "orders", name="orders", pipeline=PIPE)
    run(sink, 1)
    locker, future, pid, pool = _blocked_prepare(pg_server, db, sink, 2)
    with pg_server.connect(db) as admin:
        assert admin.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone() == (True,)
    outcome = future.result(timeout=30)
    pool.shutdown()
    locker.rollback()
    locker.close()
    assert isinstance(outcome, Retryable) and "nothing was written" in outcome.reason
    expect_exactly(pg_server.dsn(db), [1])
    assert sink.prepare(txn(2)) == OK and sink.commit(txn(2)) == OK
    expect_exactly(pg_server.dsn(db), [1, 2])


def test_statement_timeout_during_apply(pg_server: PgServer) -> None:
    db = setup_db(pg_server)
    sink = PostgresSink(
        pg_server.dsn(db), "orders", name="orders", pipeline=PIPE, statement_timeout_ms=300
    )
    run(sink, 1)
    locker = pg_server.connect(db, autocommit=False)
    locker.execute("LOCK TABLE orders IN ACCESS EXCLUSIVE MODE")
    assert sink.stage(txn(2), rows(2)) == OK
    outcome = sink.prepare(txn(2))
    locker.rollback()
    locker.close()
    assert isinstance(outcome, Retryable)
    assert "statement timeout" in outcome.reason and "nothing was written" in outcome.reason
    expect_exactly(pg_server.dsn(db), [1])
    assert sink.prepare(txn(2)) == OK and sink.commit(txn(2)) == OK
    expect_exactly(pg_server.dsn(db), [1, 2])


def test_postmaster_killed_mid_apply_then_restarted(durable_pg_server: PgServer) -> None:
    server = durable_pg_server
    db = setup_db(server)
    sink = PostgresSink(server.dsn(db), "orders", name="orders", pipeline=PIPE)
    run(sink, 1)
    locker, future, _pid, pool = _blocked_prepare(server, db, sink, 2)
    server.kill9()
    outcome = future.result(timeout=60)
    pool.shutdown()
    locker.close()
    # COMMIT was never sent: the epoch cannot be in, so it is simply retryable.
    assert isinstance(outcome, Retryable), outcome
    server.restart_after_crash()
    expect_exactly(server.dsn(db), [1])
    assert sink.prepare(txn(2)) == OK and sink.commit(txn(2)) == OK
    run(sink, 3)
    expect_exactly(server.dsn(db), [1, 2, 3])


def test_postmaster_killed_between_prepare_and_commit(durable_pg_server: PgServer) -> None:
    server = durable_pg_server
    db = setup_db(server)
    sink = PostgresSink(
        server.dsn(db), "orders", name="orders", pipeline=PIPE, resolve_timeout_s=60
    )
    run(sink, 1)
    assert sink.stage(txn(2), rows(2)) == OK
    assert sink.prepare(txn(2)) == OK
    server.kill9()
    with ThreadPoolExecutor(1) as pool:
        # The server comes back while commit() is already resolving.
        restarted = pool.submit(lambda: (time.sleep(0.5), server.restart_after_crash()))
        outcome = sink.commit(txn(2))
        restarted.result(timeout=60)
    # Crash recovery aborted the open txn (pg_xact_status aborted, or its xid
    # never became durable on the same timeline): retry the epoch.
    assert isinstance(outcome, Retryable), outcome
    expect_exactly(server.dsn(db), [1])
    assert sink.prepare(txn(2)) == OK and sink.commit(txn(2)) == OK
    expect_exactly(server.dsn(db), [1, 2])
