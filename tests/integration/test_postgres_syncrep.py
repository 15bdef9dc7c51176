"""Synchronous replication: nothing is reported committed that a failover could lose.

A real streaming standby (pg_basebackup of a throwaway primary) with
``synchronous_standby_names = '*'``; stopping it makes the primary's COMMITs
wait for it.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from reconcile.core import hooks
from reconcile.core.contract import OK, OutcomeUnknownError, SinkTxnId, WriterIdentity
from reconcile.core.progress import EpochStatus
from reconcile.engine.cycle import CommitCycle, CommitFatal, CommitSucceeded
from reconcile.engine.progress_file import FileProgressLog
from reconcile.testing.pg_proxy import CUT_AFTER_COMMIT_SENT, FaultProxy
from sinks.postgres.connection import PgTarget
from sinks.postgres.factory import postgres_sink
from sinks.postgres.markers import StateTables
from sinks.postgres.ownership import Scope
from sinks.postgres.replication import confirm_replicated
from sinks.postgres.resolve import (
    RESOLVING,
    XID_IN_PROGRESS,
    Evidence,
    InFlightTxn,
    Resolution,
    backend_identity,
    resolve_commit,
)
from sinks.postgres.sink import PostgresSink
from tests.fix_pg import PgServer, PgStandby

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

PIPE = "shop"
Pair = tuple[PgServer, PgStandby]


def setup_db(pair: Pair) -> str:
    primary, standby = pair
    db = primary.create_database()
    with primary.connect(db) as conn:
        conn.execute("CREATE TABLE a (k text PRIMARY KEY, v bigint, _epoch bigint)")
    standby.wait_caught_up()
    return db


def rows(epoch: int) -> list[dict[str, Any]]:
    return [{"k": f"e{epoch}-r{i}", "v": i} for i in range(10)]


def epochs_in(dsn: str) -> dict[int, int]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return dict(conn.execute("SELECT _epoch, count(*) FROM a GROUP BY 1").fetchall())


def wait_for_syncrep(primary: PgServer, pid: int) -> None:
    deadline = time.monotonic() + 30
    with primary.connect() as conn:
        while (
            conn.execute(
                "SELECT 1 FROM pg_stat_activity WHERE pid = %s AND wait_event = 'SyncRep'", (pid,)
            ).fetchone()
            is None
        ):
            assert time.monotonic() < deadline, "the COMMIT never waited for the standby"
            time.sleep(0.02)


@pytest.mark.parametrize("autocommit", [True, False])
def test_confirmation_waits_for_the_standby(sync_standby_pair: Pair, autocommit: bool) -> None:
    primary, standby = sync_standby_pair
    with psycopg.connect(primary.dsn(), autocommit=autocommit) as conn:
        confirm_replicated(conn, timeout_s=10, what="up")  # the standby streams
        standby.stop()
        with pytest.raises(OutcomeUnknownError) as err:
            confirm_replicated(conn, timeout_s=0.5, what="epoch 7")
        assert "epoch 7: committed on the primary" in str(err.value)
        assert "did not confirm it within 0.5s" in str(err.value)
        standby.start()
        confirm_replicated(conn, timeout_s=30, what="back")
        assert conn.autocommit is autocommit


def test_the_resolver_never_cuts_a_replication_wait(sync_standby_pair: Pair) -> None:
    primary, standby = sync_standby_pair
    db = setup_db(sync_standby_pair)
    with primary.connect(db) as conn:
        StateTables("public").create(conn)
    standby.wait_caught_up()
    standby.stop()
    # An epoch txn whose COMMIT waits for the (stopped) standby; its client gave up.
    conn = psycopg.connect(primary.dsn(db), autocommit=True)
    identity = backend_identity(conn)
    conn.autocommit = False
    xid = conn.execute("SELECT pg_current_xact_id()::text").fetchone()
    assert xid is not None
    conn.execute(
        "INSERT INTO public.reconcile_commits (pipeline, sink, epoch, target_schema, "
        "target_table, log_id, xid, backend_pid, generation, row_count) VALUES "
        "('shop', 'orders', 1, 'public', 'a', 'log', pg_current_xact_id(), 0, 0, 0)"
    )
    committer = threading.Thread(target=conn.commit, daemon=True)
    committer.start()
    wait_for_syncrep(primary, identity.pid)
    txn = InFlightTxn(SinkTxnId(PIPE, "orders", 1, 0), str(xid[0]), identity)
    scope = Scope(PIPE, "orders", "public", "a", "log")

    def resolve(timeout: float) -> Any:
        return resolve_commit(
            PgTarget.parse(primary.dsn(db)),
            StateTables("public"),
            txn,
            scope=scope,
            timeout=timeout,
        )

    # Terminating the backend would cut the wait and leave the commit on the
    # primary only; the resolver waits instead, and cannot say "committed".
    with pytest.raises(OutcomeUnknownError) as err:
        resolve(timeout=1.5)
    assert "synchronous standby" in str(err.value)
    with primary.connect() as admin:
        waiting = admin.execute(
            "SELECT wait_event FROM pg_stat_activity WHERE pid = %s", (identity.pid,)
        ).fetchone()
    assert waiting == ("SyncRep",), "the resolver terminated a replication wait"
    # The standby returns: the wait ends, and the xid decides.
    standby.start()
    committer.join(timeout=30)
    got = resolve(timeout=10)
    assert got.resolution is Resolution.COMMITTED and got.decided_by is Evidence.XID_STATUS
    conn.close()


def test_only_the_xid_can_decide_while_the_marker_is_not_readable(
    sync_standby_pair: Pair,
) -> None:
    primary, standby = sync_standby_pair
    db = setup_db(sync_standby_pair)
    proxy = FaultProxy(primary.port)
    try:
        sink = PostgresSink(primary.dsn(db, port=proxy.port), "a", name="orders")
        sink.bind(WriterIdentity(PIPE, "log-1"))
        t0, t1 = SinkTxnId(PIPE, "orders", 0, 1), SinkTxnId(PIPE, "orders", 1, 1)
        assert sink.stage(t0, rows(0)) == OK and sink.prepare(t0) == OK and sink.commit(t0) == OK
        standby.stop()
        assert sink.stage(t1, rows(1)) == OK and sink.prepare(t1) == OK
        proxy.arm(CUT_AFTER_COMMIT_SENT)
        seen: list[int] = []

        def the_standby_returns() -> None:
            # The resolver has looked: the xid is in progress, the marker not readable.
            with primary.connect(db) as conn:
                row = conn.execute(
                    "SELECT count(*) FROM reconcile.reconcile_commits WHERE epoch = 1"
                ).fetchone()
            assert row is not None
            seen.append(int(row[0]))
            standby.start()

        def the_commit_waits_for_the_standby() -> None:
            # The COMMIT reached the server and waits for the standby, before the
            # resolver looks at its backend. On a loaded machine the backend may
            # not have read the COMMIT yet; the resolver would then rightly end
            # the still-open transaction (aborted: retry), which is not this case.
            deadline = time.monotonic() + 60
            with primary.connect(db) as conn:
                waiting = "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'"
                while conn.execute(waiting).fetchone() != (1,):
                    assert time.monotonic() < deadline, "the COMMIT never waited for the standby"
                    time.sleep(0.05)

        with (
            hooks.at(RESOLVING, the_commit_waits_for_the_standby),
            hooks.at(XID_IN_PROGRESS, the_standby_returns) as window,
        ):
            assert sink.commit(t1) == OK
        assert proxy.fired.is_set() and window.fired == 1 and seen == [0]
        assert sink.last_resolution is not None
        assert sink.last_resolution.resolution is Resolution.COMMITTED
        assert sink.last_resolution.decided_by is Evidence.XID_STATUS
        standby.wait_caught_up()
        assert epochs_in(standby.dsn(db)) == {0: 10, 1: 10}
    finally:
        proxy.close()


def test_a_commit_the_standby_never_confirms_is_not_reported_and_is_replayed_after_failover(
    sync_standby_pair: Pair, tmp_path: Path
) -> None:
    primary, standby = sync_standby_pair
    db = setup_db(sync_standby_pair)
    options = {"commit_timeout_s": 1.0, "resolve_timeout_s": 1.0}

    def cycle(server: PgServer | PgStandby) -> CommitCycle:
        sink = postgres_sink(server.dsn(db), "a", name="orders", **options)
        return CommitCycle(PIPE, [sink], FileProgressLog(tmp_path, PIPE))

    first = cycle(primary)
    first.start()
    assert first.run_epoch(0, {"orders": rows(0)}) == CommitSucceeded(0)
    standby.stop()
    # The COMMIT waits for the standby: it is cancelled after commit_timeout_s
    # (the server then answers success, with a WARNING, committed locally), and
    # the sink does not report it committed.
    result = first.run_epoch(1, {"orders": rows(1)})
    assert isinstance(result, CommitFatal), result
    assert "the synchronous standby(s) (*) did not confirm it within" in result.reason
    first.close()
    assert FileProgressLog(tmp_path, PIPE).status(1) is EpochStatus.COMMITTED  # not finalized
    assert epochs_in(primary.dsn(db)) == {0: 10, 1: 10}  # on the old primary only
    # Failover to the standby, which never got epoch 1.
    standby.promote_cut_off()
    assert epochs_in(standby.dsn(db)) == {0: 10}
    after = cycle(standby)
    report = after.start()
    assert report.replay_needed == {1: ["orders"]}
    assert after.run_epoch(1, {"orders": rows(1)}) == CommitSucceeded(1)
    assert epochs_in(standby.dsn(db)) == {0: 10, 1: 10}
    after.close()
