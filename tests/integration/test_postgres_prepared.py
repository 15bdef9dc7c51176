"""Postgres sink, prepared-transaction mode: recover / commit / abort, idempotency and faults."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from reconcile.core.contract import OK, ConfigurationError, Fatal, SinkTxnId
from reconcile.testing.pg_proxy import DROP_AFTER_COMMIT, DROP_BEFORE_COMMIT, FaultProxy
from sinks.postgres.factory import postgres_sink
from sinks.postgres.prepared import PreparedPostgresSink
from sinks.postgres.resolve import Evidence, Resolution
from tests.fix_pg import PgServer

pytestmark = pytest.mark.integration

PIPE = "pipe"


def txn(epoch: int, generation: int = 0, sink: str = "orders") -> SinkTxnId:
    return SinkTxnId(PIPE, sink, epoch, generation)


def rows(epoch: int) -> list[dict[str, Any]]:
    return [{"k": f"e{epoch}-r{i}", "v": epoch * 1000 + i} for i in range(3)]


def setup_db(server: PgServer) -> str:
    name = server.create_database("p")
    with server.connect(name) as conn:
        conn.execute("CREATE TABLE orders (k text PRIMARY KEY, v bigint, _epoch bigint)")
    return name


def visible(dsn: str) -> dict[int, list[tuple[str, int]]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        got: dict[int, list[tuple[str, int]]] = {}
        for k, v, epoch in conn.execute("SELECT k, v, _epoch FROM orders ORDER BY k"):
            got.setdefault(epoch, []).append((k, v))
        markers = [r[0] for r in conn.execute("SELECT epoch FROM reconcile.reconcile_commits")]
    assert set(got) <= set(markers)
    return got


def expected(*epochs: int) -> dict[int, list[tuple[str, int]]]:
    return {e: [(r["k"], r["v"]) for r in rows(e)] for e in epochs}


def gids(dsn: str) -> list[str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return sorted(
            r[0]
            for r in conn.execute(
                "SELECT gid FROM pg_prepared_xacts WHERE database = current_database()"
            )
        )


@pytest.fixture
def db(pg_server: PgServer) -> Iterator[str]:
    name = setup_db(pg_server)
    yield name
    with pg_server.connect(name) as conn:
        for gid in gids(pg_server.dsn(name)):
            conn.execute(f"ROLLBACK PREPARED '{gid}'")
    pg_server.drop_database(name)


def test_prepare_is_durable_invisible_and_recoverable(pg_server: PgServer, db: str) -> None:
    dsn = pg_server.dsn(db)
    sink = postgres_sink(dsn, "orders", mode="prepared", name="orders", pipeline=PIPE)
    assert isinstance(sink, PreparedPostgresSink)
    for epoch in (1, 2, 3):  # several epochs prepared at once
        assert sink.stage(txn(epoch), rows(epoch)) == OK
        assert sink.prepare(txn(epoch)) == OK
    assert visible(dsn) == {}
    assert gids(dsn) == [str(txn(e)) for e in (1, 2, 3)]
    # Another pipeline's and another application's prepared txns are not ours.
    with psycopg.connect(dsn) as other:
        other.execute("SELECT 1")
        other.execute("PREPARE TRANSACTION 'someone-else'")
    restarted = PreparedPostgresSink(dsn, "orders", name="orders", pipeline=PIPE)
    assert list(restarted.recover()) == [txn(1), txn(2), txn(3)]
    assert restarted.commit(txn(1)) == OK
    assert restarted.commit(txn(1)) == OK  # idempotent: the marker proves it
    assert restarted.commit(txn(1, generation=5)) == OK  # any generation
    assert restarted.abort(txn(2)) == OK
    assert restarted.abort(txn(2)) == OK  # aborting an unknown txn is OK
    # A commit of the rolled-back epoch is not OK: nothing is there to commit.
    outcome = restarted.commit(txn(2))
    assert isinstance(outcome, Fatal) and "replay the epoch" in outcome.reason
    # A txn prepared by generation 0 can be committed by generation 1 (by key).
    assert restarted.commit(txn(3, generation=1)) == OK
    assert visible(dsn) == expected(1, 3)
    assert list(restarted.recover()) == []
    assert gids(dsn) == ["someone-else"]
    # Aborting a committed epoch is refused: committed data stays.
    assert isinstance(restarted.abort(txn(1)), Fatal)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("ROLLBACK PREPARED 'someone-else'")


def test_prepare_twice_replaces_and_replay_writes_nothing(pg_server: PgServer, db: str) -> None:
    dsn = pg_server.dsn(db)
    sink = PreparedPostgresSink(dsn, "orders", name="orders", pipeline=PIPE)
    for _ in range(2):
        assert sink.stage(txn(1), rows(1)) == OK
        assert sink.prepare(txn(1)) == OK
    assert gids(dsn) == [str(txn(1))]
    assert sink.commit(txn(1)) == OK
    again = PreparedPostgresSink(dsn, "orders", name="orders", pipeline=PIPE)
    assert again.stage(txn(1), [{"k": "other", "v": 0}]) == OK
    assert again.prepare(txn(1)) == OK and again.commit(txn(1)) == OK
    assert visible(dsn) == expected(1)
    assert gids(dsn) == []


def test_zombie_cannot_replace_or_abort_a_newer_generation(pg_server: PgServer, db: str) -> None:
    dsn = pg_server.dsn(db)
    new = PreparedPostgresSink(dsn, "orders", name="orders", pipeline=PIPE)
    assert new.stage(txn(1, 2), rows(1)) == OK and new.prepare(txn(1, 2)) == OK
    zombie = PreparedPostgresSink(dsn, "orders", name="orders", pipeline=PIPE)
    assert zombie.stage(txn(1, 1), [{"k": "zombie", "v": -1}]) == OK
    outcome = zombie.prepare(txn(1, 1))
    assert isinstance(outcome, Fatal) and "fenced" in outcome.reason
    assert zombie.abort(txn(1, 1)) == OK
    assert gids(dsn) == [str(txn(1, 2))]  # the newer generation's txn survives
    assert new.commit(txn(1, 2)) == OK
    assert zombie.stage(txn(2, 1), [{"k": "zombie", "v": -1}]) == OK
    outcome = zombie.prepare(txn(2, 1))
    assert isinstance(outcome, Fatal) and "fenced" in outcome.reason
    assert visible(dsn) == expected(1)


def test_max_prepared_transactions_zero_is_a_clear_error(pg_server: PgServer) -> None:
    server = PgServer(max_prepared_transactions=0)
    try:
        name = setup_db(server)
        sink = PreparedPostgresSink(server.dsn(name), "orders", name="orders", pipeline=PIPE)
        with pytest.raises(ConfigurationError) as err:
            sink.setup()
        assert "max_prepared_transactions" in str(err.value)
        assert "postgresql.conf" in str(err.value) and "restart" in str(err.value)
        assert sink.stage(txn(1), rows(1)) == OK
        outcome = sink.prepare(txn(1))
        assert isinstance(outcome, Fatal) and "max_prepared_transactions = 0" in outcome.reason
        # Transactional mode works on the same server.
        plain = postgres_sink(server.dsn(name), "orders", name="orders", pipeline=PIPE)
        assert plain.stage(txn(1), rows(1)) == OK
        assert plain.prepare(txn(1)) == OK and plain.commit(txn(1)) == OK
    finally:
        server.stop()


@pytest.mark.chaos
@pytest.mark.parametrize("fault", [DROP_AFTER_COMMIT, DROP_BEFORE_COMMIT])
def test_commit_prepared_without_reply(pg_server: PgServer, db: str, fault: str) -> None:
    proxy = FaultProxy(pg_server.port)
    try:
        sink = PreparedPostgresSink(
            pg_server.dsn(db, port=proxy.port), "orders", name="orders", pipeline=PIPE
        )
        assert sink.stage(txn(1), rows(1)) == OK and sink.prepare(txn(1)) == OK
        proxy.arm(fault)
        # Reply lost: pg_prepared_xacts no longer lists it and the marker is
        # there. Never sent: still prepared, so it is committed again.
        assert sink.commit(txn(1)) == OK
        assert proxy.fired.is_set()
        # What decided: the xid's status (reply lost), or the gid still listed.
        decided = {
            DROP_AFTER_COMMIT: (Resolution.COMMITTED, Evidence.XID_STATUS),
            DROP_BEFORE_COMMIT: (Resolution.PREPARED, Evidence.PREPARED_XACTS),
        }[fault]
        assert sink.last_resolution is not None
        assert (sink.last_resolution.resolution, sink.last_resolution.decided_by) == decided
        assert visible(pg_server.dsn(db)) == expected(1)
        assert gids(pg_server.dsn(db)) == []
    finally:
        proxy.close()


@pytest.mark.chaos
def test_prepared_epoch_survives_kill9_of_the_postmaster(durable_pg_server: PgServer) -> None:
    server = durable_pg_server
    name = setup_db(server)
    dsn = server.dsn(name)
    sink = PreparedPostgresSink(dsn, "orders", name="orders", pipeline=PIPE)
    for epoch in (1, 2):
        assert sink.stage(txn(epoch), rows(epoch)) == OK and sink.prepare(txn(epoch)) == OK
    assert sink.commit(txn(1)) == OK
    server.kill9()
    server.restart_after_crash()
    restarted = PreparedPostgresSink(dsn, "orders", name="orders", pipeline=PIPE)
    assert list(restarted.recover()) == [txn(2)]
    assert restarted.commit(txn(2)) == OK
    assert visible(dsn) == expected(1, 2)
    # The old client's connection died with the server; it reconnects.
    assert sink.stage(txn(3), rows(3)) == OK
    assert sink.prepare(txn(3)) == OK and sink.commit(txn(3)) == OK
    assert visible(dsn) == expected(1, 2, 3)


@pytest.mark.parametrize("mode", ["transactional", "prepared"])
def test_every_row_form_without_epoch_column(pg_server: PgServer, db: str, mode: str) -> None:
    import pyarrow as pa

    from reconcile.core.contract import Change

    dsn = pg_server.dsn(db)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE plain (a int, b text, v float8, PRIMARY KEY (a, b))")
    sink = postgres_sink(dsn, "plain", mode=mode, name="plain", pipeline=PIPE)
    t1 = txn(1, sink="plain")
    arrow = pa.table({"a": [1, 1, 2], "b": ["x", "y", "x"], "v": [0.5, 1.5, 2.5]})
    assert sink.stage(t1, arrow) == OK
    assert sink.prepare(t1) == OK and sink.commit(t1) == OK
    t2 = txn(2, sink="plain")
    changes = [
        Change("delete", {"a": 1, "b": "y"}),
        Change("upsert", {"a": 2, "b": "x", "v": 9.0}),
        {"a": 3, "b": "z", "v": None},
    ]
    assert sink.stage(t2, changes) == OK
    assert sink.prepare(t2) == OK and sink.commit(t2) == OK
    with psycopg.connect(dsn, autocommit=True) as conn:
        got = conn.execute("SELECT a, b, v FROM plain ORDER BY a, b").fetchall()
    assert got == [(1, "x", 0.5), (2, "x", 9.0), (3, "z", None)]


def test_zombie_cannot_commit_a_newer_generations_prepared_txn(
    pg_server: PgServer, db: str
) -> None:
    dsn = pg_server.dsn(db)
    new = PreparedPostgresSink(dsn, "orders", name="orders", pipeline=PIPE)
    assert new.stage(txn(1, 2), rows(1)) == OK and new.prepare(txn(1, 2)) == OK
    zombie = PreparedPostgresSink(dsn, "orders", name="orders", pipeline=PIPE)
    outcome = zombie.commit(txn(1, 1))
    assert isinstance(outcome, Fatal) and "fenced" in outcome.reason
    assert gids(dsn) == [str(txn(1, 2))] and visible(dsn) == {}
    # The newer generation decides: here it aborts, and nothing is visible.
    assert new.abort(txn(1, 2)) == OK
    assert gids(dsn) == [] and visible(dsn) == {}
