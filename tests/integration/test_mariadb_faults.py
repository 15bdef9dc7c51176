"""MariaDB through the SQL sink: a COMMIT whose reply is lost, through the wire protocol's proxy.

There is no transaction id to ask MariaDB about; the sink ends the session
that ran the epoch (KILL, then waits until the session let go of its mark),
and the marker written in the epoch's transaction decides. The session is
recognised by its mark (a named lock only it took), never by its id alone:
after a restart the id may be another client's.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pymysql
import pytest
import sqlalchemy as sa

from reconcile.core import hooks
from reconcile.core.contract import OK, Fatal, Retryable, SinkTxnId, WriterIdentity
from reconcile.testing.mysql_proxy import (
    CUT_AFTER_COMMIT_SENT,
    DROP_AFTER_COMMIT,
    DROP_BEFORE_COMMIT,
    MysqlFaultProxy,
)
from sinks.sql.sessions import KILLING
from sinks.sql.sink import SqlSink
from tests.mariadb_server import MariadbServer

pytestmark = pytest.mark.integration

PIPE = "pipe"
# A replay that meets a lock left by the old session fails in a second, not in 50.
FAST_LOCKS = "?init_command=SET%20SESSION%20innodb_lock_wait_timeout%20%3D%201"


def txn(epoch: int) -> SinkTxnId:
    return SinkTxnId(PIPE, "orders", epoch, 0)


def rows(epoch: int) -> list[dict[str, Any]]:
    return [{"k": f"e{epoch}-r{i}", "v": epoch * 1000 + i} for i in range(3)]


@pytest.fixture
def db(mariadb_server: MariadbServer) -> Iterator[str]:
    name = mariadb_server.create_database("f")
    with mariadb_server.connect(name) as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE orders (k VARCHAR(32) COLLATE utf8mb4_nopad_bin PRIMARY KEY, "
                    "v BIGINT, _epoch BIGINT)")  # fmt: skip
    yield name
    mariadb_server.drop_database(name)


@pytest.fixture
def proxy(mariadb_server: MariadbServer) -> Iterator[MysqlFaultProxy]:
    p = MysqlFaultProxy(mariadb_server.port)
    yield p
    p.close()


def sink_via(server: MariadbServer, db: str, proxy: MysqlFaultProxy) -> SqlSink:
    sink = SqlSink(server.url(db, port=proxy.port) + FAST_LOCKS, "orders", name="orders")
    sink.bind(WriterIdentity(PIPE, "log-1"))
    return sink


def committed(server: MariadbServer, db: str) -> dict[int, list[tuple[str, int]]]:
    """Epoch -> rows, read directly; also one marker per epoch that has rows."""
    with server.connect(db) as conn, conn.cursor() as cur:
        cur.execute("SELECT k, v, _epoch FROM orders ORDER BY k")
        got: dict[int, list[tuple[str, int]]] = {}
        for k, v, epoch in cur.fetchall():
            got.setdefault(int(epoch), []).append((k, int(v)))
        cur.execute("SELECT epoch FROM reconcile_sql_commits")
        markers = [int(r[0]) for r in cur.fetchall()]
    assert set(got) <= set(markers), "rows without a marker"
    return got


def expect_exactly(server: MariadbServer, db: str, epochs: list[int]) -> None:
    assert committed(server, db) == {e: [(r["k"], r["v"]) for r in rows(e)] for e in epochs}


def run(sink: SqlSink, epoch: int) -> None:
    assert sink.stage(txn(epoch), rows(epoch)) == OK
    assert sink.prepare(txn(epoch)) == OK
    assert sink.commit(txn(epoch)) == OK


def sessions(server: MariadbServer) -> set[int]:
    with server.connect() as conn, conn.cursor() as cur:
        cur.execute("SELECT id FROM information_schema.processlist")
        return {int(r[0]) for r in cur.fetchall()}


@pytest.mark.parametrize("fault", [DROP_AFTER_COMMIT, CUT_AFTER_COMMIT_SENT, DROP_BEFORE_COMMIT])
def test_a_commit_without_reply_is_settled_by_the_marker(
    mariadb_server: MariadbServer, db: str, proxy: MysqlFaultProxy, fault: str
) -> None:
    sink = sink_via(mariadb_server, db, proxy)
    run(sink, 1)
    assert sink.stage(txn(2), rows(2)) == OK
    assert sink.prepare(txn(2)) == OK
    session = sink._open[txn(2).key].held.session  # type: ignore[union-attr]
    proxy.arm(fault)
    outcome = sink.commit(txn(2))
    assert proxy.fired.is_set()
    # The old session was ended before the marker was read: its outcome is final.
    assert session is not None and session.id not in sessions(mariadb_server)
    if fault == DROP_BEFORE_COMMIT:
        # The server never got the COMMIT: no marker, the epoch is replayed.
        assert isinstance(outcome, Fatal) and "did not commit" in outcome.reason
        expect_exactly(mariadb_server, db, [1])
        assert sink.prepare(txn(2)) == OK and sink.commit(txn(2)) == OK
    else:
        # The server got it: the marker is there, and nothing is written twice.
        assert outcome == OK
        expect_exactly(mariadb_server, db, [1, 2])
    run(sink, 2)  # a replay of a committed epoch writes nothing
    run(sink, 3)
    expect_exactly(mariadb_server, db, [1, 2, 3])
    sink.close()


def test_a_session_cut_off_by_a_partition_is_ended_before_the_marker_is_read(
    mariadb_server: MariadbServer, db: str, proxy: MysqlFaultProxy
) -> None:
    # The client loses the server, the server does not notice: the epoch's session
    # lives on, idle in its transaction, holding the marker's and the rows' locks.
    sink = sink_via(mariadb_server, db, proxy)
    assert sink.stage(txn(1), rows(1)) == OK
    assert sink.prepare(txn(1)) == OK
    session = sink._open[txn(1).key].held.session  # type: ignore[union-attr]
    proxy.partition()
    assert session is not None and session.id in sessions(mariadb_server)
    outcome = sink.commit(txn(1))
    # Ended, so no COMMIT of it can land later: "no marker" is the final answer,
    # and the replay finds no lock of it in its way.
    assert isinstance(outcome, Fatal) and "did not commit" in outcome.reason
    assert session.id not in sessions(mariadb_server)
    direct = SqlSink(mariadb_server.url(db) + FAST_LOCKS, "orders", name="orders")
    direct.bind(WriterIdentity(PIPE, "log-1"))
    run(direct, 1)
    expect_exactly(mariadb_server, db, [1])
    direct.close()
    sink.close()


def test_a_kill_that_failed_is_done_again_before_the_marker_is_trusted(
    mariadb_server: MariadbServer, db: str, proxy: MysqlFaultProxy
) -> None:
    # The epoch's session lives on behind a partition, holding its uncommitted
    # marker. The first resolution fails at its KILL; the retry must end the
    # session before it reads "no marker", or a late COMMIT could still land.
    sink = sink_via(mariadb_server, db, proxy)
    assert sink.stage(txn(1), rows(1)) == OK
    assert sink.prepare(txn(1)) == OK
    session = sink._open[txn(1).key].held.session  # type: ignore[union-attr]
    assert session is not None
    proxy.partition()

    def refused() -> None:
        raise sa.exc.OperationalError("KILL CONNECTION", {}, Exception("injected: no reply"))

    with hooks.at(KILLING, refused) as arming:
        first = sink.commit(txn(1))
    assert arming.fired == 1
    assert isinstance(first, Retryable), first
    assert session.id in sessions(mariadb_server)  # the fault fired: it still runs
    again = sink.commit(txn(1))
    assert session.id not in sessions(mariadb_server)
    assert isinstance(again, Fatal) and "did not commit" in again.reason
    direct = SqlSink(mariadb_server.url(db) + FAST_LOCKS, "orders", name="orders")
    direct.bind(WriterIdentity(PIPE, "log-1"))
    run(direct, 1)
    expect_exactly(mariadb_server, db, [1])
    direct.close()
    sink.close()


def test_a_server_killed_between_prepare_and_commit_then_restarted(tmp_path: Any) -> None:
    # The database restarts mid-epoch: the open transaction dies with it. Session
    # ids start again from 1 after a restart, so the old epoch's id may now be
    # another client's session: it must not be killed, however soon the server
    # came back (the session's mark, a named lock, died with the server).
    with MariadbServer() as server:
        db = server.create_database("r")
        with server.connect(db) as conn, conn.cursor() as cur:
            cur.execute("CREATE TABLE orders (k VARCHAR(32) COLLATE utf8mb4_nopad_bin PRIMARY KEY, "
                        "v BIGINT, _epoch BIGINT)")  # fmt: skip
        sink = SqlSink(server.url(db) + FAST_LOCKS, "orders", name="orders")
        sink.bind(WriterIdentity(PIPE, "log-1"))
        run(sink, 1)
        assert sink.stage(txn(2), rows(2)) == OK
        assert sink.prepare(txn(2)) == OK
        session = sink._open[txn(2).key].held.session  # type: ignore[union-attr]
        assert session is not None
        server.kill9()
        server.start()
        bystanders = [server.connect(db) for _ in range(session.id + 2)]
        ids = {b.thread_id() for b in bystanders}
        assert session.id in ids  # the old id names a new session now
        outcome = sink.commit(txn(2))
        assert isinstance(outcome, Fatal) and "did not commit" in outcome.reason
        assert ids <= sessions(server), "a session of another client was killed"
        for bystander in bystanders:
            bystander.close()
        assert sink.prepare(txn(2)) == OK and sink.commit(txn(2)) == OK
        run(sink, 3)
        expect_exactly(server, db, [1, 2, 3])
        sink.close()


def test_the_proxy_passes_a_password_login(mariadb_server: MariadbServer, db: str) -> None:
    proxy = MysqlFaultProxy(mariadb_server.port)
    try:
        from tests.mariadb_server import PASSWORD, PASSWORD_USER

        conn = pymysql.connect(host="127.0.0.1", port=proxy.port, user=PASSWORD_USER,
                               password=PASSWORD, database=db)  # fmt: skip
        with conn.cursor() as cur:
            cur.execute("SELECT 1")
            assert cur.fetchone() == (1,)
        conn.close()
    finally:
        proxy.close()


def test_a_missing_driver_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from reconcile.core.contract import ConfigurationError

    monkeypatch.setitem(__import__("sys").modules, "pymysql", None)  # as if not installed
    url = "mariadb+pymysql://app:s3cret@127.0.0.1:1/shop"
    with pytest.raises(ConfigurationError, match=r"reconcile-engine\[mariadb\]") as raised:
        SqlSink(url, "orders", name="orders")
    assert "s3cret" not in str(raised.value)
