"""Postgres sink, transactional mode: writes, markers, replay, append-only ids, fencing, names."""

from __future__ import annotations

import logging
import uuid
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from psycopg import sql

from reconcile.core.contract import (
    OK,
    Change,
    ConfigurationError,
    Fatal,
    ReconcileError,
    Retryable,
    SinkTxnId,
)
from reconcile.core.ids import change_id
from sinks.base import TwoPhaseSink
from sinks.postgres.connection import PgTarget
from sinks.postgres.sink import PostgresSink
from tests.fix_pg import PASSWORD, PASSWORD_USER, PgServer

pytestmark = pytest.mark.integration

PIPE = "pipe"


def txn(epoch: int, generation: int = 0, sink: str = "orders") -> SinkTxnId:
    return SinkTxnId(PIPE, sink, epoch, generation)


def make_table(
    dsn: str, ddl: str = "k text PRIMARY KEY, v bigint, _epoch bigint", name: str = "orders"
) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE TABLE {} (" + ddl + ")").format(sql.Identifier(name)))


def rows_of(dsn: str, query: str, params: Any = None) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(query, params).fetchall()


def run_epoch(sink: PostgresSink, t: SinkTxnId, rows: Any) -> None:
    assert sink.stage(t, rows) == OK
    assert sink.prepare(t) == OK
    assert sink.commit(t) == OK


@pytest.fixture
def orders(pg_db: str) -> str:
    make_table(pg_db)
    return pg_db


def test_upserts_deletes_epoch_column_and_marker(orders: str) -> None:
    sink = PostgresSink(orders, "orders", name="orders", pipeline=PIPE)
    assert isinstance(sink, TwoPhaseSink)
    run_epoch(sink, txn(1), [{"k": "a", "v": 1}, {"k": "b", "v": 2}, {"k": "c", "v": 3}])
    run_epoch(
        sink,
        txn(2),
        [{"k": "a", "v": 10}, Change("delete", {"k": "b"}), Change("upsert", {"k": "d", "v": 4})],
    )
    assert rows_of(orders, "SELECT k, v, _epoch FROM orders ORDER BY k") == [
        ("a", 10, 2),
        ("c", 3, 1),
        ("d", 4, 2),
    ]
    markers = rows_of(
        orders,
        "SELECT pipeline, sink, epoch, generation, row_count, xid::text, "
        "backend_pid FROM reconcile.reconcile_commits ORDER BY epoch",
    )
    assert [m[:5] for m in markers] == [(PIPE, "orders", 1, 0, 3), (PIPE, "orders", 2, 0, 3)]
    assert all(int(m[5]) > 0 and m[6] > 0 for m in markers)
    sink.close()


def test_empty_epoch_writes_only_its_marker(orders: str) -> None:
    sink = PostgresSink(orders, "orders", name="orders", pipeline=PIPE)
    # Nothing staged in this client (e.g. after a restart) is not an empty epoch.
    outcome = sink.prepare(txn(7))
    assert isinstance(outcome, Retryable) and "stage the epoch again" in outcome.reason
    assert sink.stage(txn(7), []) == OK
    assert sink.prepare(txn(7)) == OK
    assert sink.commit(txn(7)) == OK
    assert rows_of(orders, "SELECT epoch FROM reconcile.reconcile_commits") == [(7,)]
    assert rows_of(orders, "SELECT count(*) FROM orders") == [(0,)]


def test_idempotent_commit_abort_and_replay(orders: str) -> None:
    sink = PostgresSink(orders, "orders", name="orders", pipeline=PIPE)
    run_epoch(sink, txn(1), [{"k": "a", "v": 1}])
    # Committing a committed epoch (any generation, any process) is OK.
    assert sink.commit(txn(1)) == OK
    assert PostgresSink(orders, "orders", name="orders", pipeline=PIPE).commit(txn(1, 3)) == OK
    # Aborting an unknown txn is OK.
    assert sink.abort(txn(99)) == OK
    # A replay of epoch 1 with other content (a restarted process) writes nothing.
    again = PostgresSink(orders, "orders", name="orders", pipeline=PIPE)
    run_epoch(again, txn(1), [{"k": "a", "v": 1000}, {"k": "z", "v": 5}])
    assert rows_of(orders, "SELECT k, v FROM orders") == [("a", 1)]
    assert rows_of(orders, "SELECT count(*) FROM reconcile.reconcile_commits") == [(1,)]
    assert again.recover() == []


def test_commit_without_prepare_and_without_marker_is_fatal(orders: str) -> None:
    sink = PostgresSink(orders, "orders", name="orders", pipeline=PIPE)
    outcome = sink.commit(txn(5))
    assert isinstance(outcome, Fatal) and "replay the epoch" in outcome.reason


def test_abort_rolls_back_prepared_epoch(orders: str) -> None:
    sink = PostgresSink(orders, "orders", name="orders", pipeline=PIPE)
    assert sink.stage(txn(1), [{"k": "a", "v": 1}]) == OK
    assert sink.prepare(txn(1)) == OK
    assert sink.abort(txn(1)) == OK
    assert sink.abort(txn(1)) == OK
    assert rows_of(orders, "SELECT count(*) FROM orders") == [(0,)]
    assert rows_of(orders, "SELECT count(*) FROM reconcile.reconcile_commits") == [(0,)]
    run_epoch(sink, txn(1), [{"k": "a", "v": 2}])
    assert rows_of(orders, "SELECT k, v FROM orders") == [("a", 2)]


def test_append_only_target_replay_keeps_change_ids_unique(pg_db: str) -> None:
    make_table(pg_db, "change_id uuid PRIMARY KEY, item text NOT NULL, _epoch bigint", "events")

    def changes(epoch: int) -> list[Change]:
        return [
            Change("upsert", {"item": f"x{i}"}, str(change_id(PIPE, epoch, f"off-{i}", 0)))
            for i in range(5)
        ]

    sink = PostgresSink(pg_db, "events", name="events", pipeline=PIPE, append_only=True)
    run_epoch(sink, txn(1, sink="events"), changes(1))
    # Replay of the same epoch by a restarted writer: same ids, nothing added.
    again = PostgresSink(pg_db, "events", name="events", pipeline=PIPE, append_only=True)
    run_epoch(again, txn(1, sink="events"), changes(1))
    # Replay under a later epoch number (the marker cannot catch it): the
    # stable change ids do, through ON CONFLICT DO NOTHING.
    run_epoch(again, txn(2, sink="events"), changes(1))
    got = rows_of(pg_db, "SELECT change_id, item, _epoch FROM events ORDER BY item")
    assert [(r[1], r[2]) for r in got] == [(f"x{i}", 1) for i in range(5)]
    assert {r[0] for r in got} == {change_id(PIPE, 1, f"off-{i}", 0) for i in range(5)}
    assert all(isinstance(r[0], uuid.UUID) and r[0].version == 7 for r in got)
    # Deletes make no sense in an append-only target.
    outcome = again.stage(txn(3, sink="events"), [Change("delete", {"item": "x"}, "id")])
    assert isinstance(outcome, Fatal) and "append-only" in outcome.reason


def test_arrow_table_and_created_epoch_column(pg_db: str) -> None:
    make_table(
        pg_db,
        "id bigint PRIMARY KEY, name text, score double precision, "
        "at timestamptz, amount numeric(12,2)",
        "facts",
    )
    sink = PostgresSink(pg_db, "facts", name="facts", pipeline=PIPE, create_epoch_column=True)
    table = pa.table(
        {
            "id": pa.array(range(1000), pa.int64()),
            "name": pa.array([None if i % 7 == 0 else f'n"{i},\n' for i in range(1000)]),
            "score": pa.array([i / 3 for i in range(1000)]),
            "at": pa.array(
                [1_700_000_000_000_000 + i for i in range(1000)], pa.timestamp("us", tz="UTC")
            ),
            "amount": pa.array([i * 1.25 for i in range(1000)]),
        }
    )
    run_epoch(sink, txn(4, sink="facts"), table)
    got = rows_of(
        pg_db, "SELECT count(*), count(name), min(_epoch), max(_epoch), sum(amount) FROM facts"
    )
    assert got[0][:4] == (1000, 1000 - 143, 4, 4)
    assert float(got[0][4]) == pytest.approx(sum(i * 1.25 for i in range(1000)))
    assert rows_of(pg_db, "SELECT name FROM facts WHERE id = 1") == [('n"1,\n',)]
    # Upsert over Arrow: the same keys again with new values.
    run_epoch(sink, txn(5, sink="facts"), table.set_column(2, "score", pa.array([0.0] * 1000)))
    assert rows_of(pg_db, "SELECT count(*), sum(score), min(_epoch) FROM facts") == [(1000, 0.0, 5)]


def test_zombie_writer_is_fenced_inside_the_txn(orders: str) -> None:
    old = PostgresSink(orders, "orders", name="orders", pipeline=PIPE)
    run_epoch(old, txn(1, generation=1), [{"k": "a", "v": 1}])
    new = PostgresSink(orders, "orders", name="orders", pipeline=PIPE)
    run_epoch(new, txn(2, generation=2), [{"k": "b", "v": 2}])
    # The zombie (generation 1) wakes up and writes epoch 3: rejected.
    assert old.stage(txn(3, generation=1), [{"k": "zombie", "v": 666}]) == OK
    outcome = old.prepare(txn(3, generation=1))
    assert isinstance(outcome, Fatal) and "fenced" in outcome.reason
    assert rows_of(orders, "SELECT k FROM orders ORDER BY k") == [("a",), ("b",)]
    assert rows_of(orders, "SELECT generation FROM reconcile.reconcile_fences") == [(2,)]
    run_epoch(new, txn(3, generation=2), [{"k": "c", "v": 3}])
    assert rows_of(
        orders, "SELECT epoch, generation FROM reconcile.reconcile_commits ORDER BY 1"
    ) == [
        (1, 1),
        (2, 2),
        (3, 2),
    ]


def test_zombie_with_open_txn_blocks_takeover_until_it_ends(orders: str) -> None:
    old = PostgresSink(orders, "orders", name="orders", pipeline=PIPE)
    assert old.stage(txn(1, 1), [{"k": "a", "v": 1}]) == OK
    assert old.prepare(txn(1, 1)) == OK  # holds the fence row FOR UPDATE
    new = PostgresSink(orders, "orders", name="orders", pipeline=PIPE, lock_timeout_ms=300)
    assert new.stage(txn(1, 2), [{"k": "a", "v": 2}]) == OK
    outcome = new.prepare(txn(1, 2))
    assert not outcome and "lock" in str(outcome).lower()
    assert old.commit(txn(1, 1)) == OK
    # Now the newer writer sees the marker: epoch 1 is in, exactly once.
    assert new.prepare(txn(1, 2)) == OK and new.commit(txn(1, 2)) == OK
    assert rows_of(orders, "SELECT k, v FROM orders") == [("a", 1)]


INJECTION = 'x"; DROP TABLE y; --'


def test_injection_named_identifiers_work_as_names(pg_db: str) -> None:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE y (id int)")
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(INJECTION)))
        conn.execute(
            sql.SQL("CREATE TABLE {} ({} text PRIMARY KEY, {} int, _epoch bigint)").format(
                sql.Identifier(INJECTION, INJECTION),
                sql.Identifier(INJECTION),
                sql.Identifier("v'); DROP TABLE y; --"),
            )
        )
    sink = PostgresSink(
        pg_db, INJECTION, schema=INJECTION, state_schema=INJECTION, name="inj", pipeline=PIPE
    )
    row = {INJECTION: "Robert'); DROP TABLE y;--", "v'); DROP TABLE y; --": 1}
    run_epoch(sink, txn(1, sink="inj"), [row])
    run_epoch(sink, txn(2, sink="inj"), [Change("delete", {INJECTION: "nobody"})])
    got = rows_of(
        pg_db,
        sql.SQL("SELECT * FROM {}").format(sql.Identifier(INJECTION, INJECTION)).as_string(None),
    )
    assert got == [("Robert'); DROP TABLE y;--", 1, 1)]
    assert rows_of(pg_db, "SELECT to_regclass('y') IS NOT NULL") == [(True,)]
    assert rows_of(
        pg_db,
        sql.SQL("SELECT count(*) FROM {}")
        .format(sql.Identifier(INJECTION, "reconcile_commits"))
        .as_string(None),
    ) == [(2,)]


def test_dsn_and_sqlalchemy_urls_parse_and_redact(pg_server: PgServer) -> None:
    url = f"postgresql+psycopg://{PASSWORD_USER}:{PASSWORD.replace('!', '%21')}@127.0.0.1:1/db"
    target = PgTarget.parse(url)
    assert target.password == PASSWORD
    assert target.params["port"] == "1" and target.params["dbname"] == "db"
    kv = PgTarget.parse(f"host=h port=5 dbname=d user=u password='{PASSWORD}'")
    assert kv.password == PASSWORD
    for shown in (repr(target), str(target), repr(kv), str(kv), target.describe()):
        assert PASSWORD not in shown and "Pa55" not in shown
    with pytest.raises(ConfigurationError) as bad:
        PgTarget.parse(f"host=h password={PASSWORD} = =broken")
    assert "Pa55" not in str(bad.value)


def test_password_never_in_errors_reprs_or_logs(
    pg_server: PgServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    name = pg_server.create_database()
    make_table(pg_server.dsn(name))
    secret = PASSWORD.replace("!", "%21")
    good = (
        f"postgresql://{PASSWORD_USER}:{secret}@127.0.0.1:{pg_server.port}/{name}?sslmode=disable"
    )
    sink = PostgresSink(good, "orders", name="orders", pipeline=PIPE)
    run_epoch(sink, txn(1), [{"k": "a", "v": 1}])  # the password works
    wrong = good.replace("Pa55", "Fa1l")
    bad_pw = PostgresSink(wrong, "orders", name="orders", pipeline=PIPE)
    down = PostgresSink(
        f"host=127.0.0.1 port=1 dbname=x user=u password='{PASSWORD}' connect_timeout=2",
        "orders",
        name="orders",
        pipeline=PIPE,
    )
    texts = [repr(sink), repr(bad_pw), repr(down), repr(sink.target)]
    for broken in (bad_pw, down):
        assert broken.stage(txn(2), [{"k": "b", "v": 2}]) == OK
        outcome = broken.prepare(txn(2))
        assert not outcome
        texts.append(str(outcome))
        with pytest.raises(ReconcileError) as err:
            broken.setup()
        texts.append(str(err.value))
    assert "password authentication failed" in texts[4]
    texts.append(caplog.text)
    for text in texts:
        assert PASSWORD not in text and "Fa1lword" not in text and "Pa55word" not in text, text


def test_large_arrow_epoch_direct_copy_and_its_fallback(pg_db: str) -> None:
    from reconcile.core import hooks
    from sinks.postgres.apply import DIRECT_COPY_PROBED

    make_table(pg_db, "id bigint PRIMARY KEY, v bigint, _epoch bigint", "big")
    sink = PostgresSink(pg_db, "big", name="big", pipeline=PIPE)
    n = 20_000
    first = pa.table({"id": pa.array(range(n), pa.int64()), "v": pa.array([1] * n, pa.int64())})
    run_epoch(sink, txn(1, sink="big"), first)  # key range free: straight COPY
    # Overlapping keys: the probe sees them, so the upsert path runs.
    second = pa.table(
        {"id": pa.array(range(n // 2, n + n // 2), pa.int64()), "v": pa.array([2] * n)}
    )
    run_epoch(sink, txn(2, sink="big"), second)

    # A concurrent writer inserts a key of a free range after the probe: the
    # direct COPY fails on it, and the epoch's txn with it (no savepoint).
    def concurrent_insert() -> None:
        with psycopg.connect(pg_db, autocommit=True) as other:
            other.execute("INSERT INTO big (id, v) VALUES (%s, -1)", (3 * n,))

    third = pa.table(
        {"id": pa.array(range(2 * n, 4 * n), pa.int64()), "v": pa.array([3] * (2 * n))}
    )
    t3 = txn(3, sink="big")
    assert sink.stage(t3, third) == OK
    with hooks.at(DIRECT_COPY_PROBED, concurrent_insert) as window:
        outcome = sink.prepare(t3)
    assert window.fired == 1
    assert isinstance(outcome, Retryable), outcome
    assert "another transaction" in outcome.reason and "big_pkey" in outcome.reason
    sink.abort(t3)
    assert rows_of(pg_db, "SELECT count(*) FROM big WHERE _epoch = 3") == [(0,)]
    # The retry's probe sees that row: the upsert path runs, over it too.
    run_epoch(sink, t3, third)
    got = rows_of(pg_db, "SELECT v, _epoch, count(*) FROM big GROUP BY 1, 2 ORDER BY 1")
    assert got == [(1, 1, n // 2), (2, 2, n), (3, 3, 2 * n)]


def test_eager_takeover_fences_the_old_writer_before_the_new_one_writes(orders: str) -> None:
    from reconcile.core.contract import FencedError

    old = PostgresSink(orders, "orders", name="orders", pipeline=PIPE)
    run_epoch(old, txn(1, generation=1), [{"k": "a", "v": 1}])
    new = PostgresSink(orders, "orders", name="orders", pipeline=PIPE)
    new.fence(PIPE, 2)
    new.fence(PIPE, 2)  # idempotent
    assert old.stage(txn(2, generation=1), [{"k": "zombie", "v": 0}]) == OK
    outcome = old.prepare(txn(2, generation=1))
    assert isinstance(outcome, Fatal) and "fenced" in outcome.reason
    with pytest.raises(FencedError):
        old.fence(PIPE, 1)
    assert rows_of(orders, "SELECT k FROM orders") == [("a",)]


def test_a_password_with_a_percent_escape_authenticates(private_pg_server: PgServer) -> None:
    server = private_pg_server
    literal = "S3cr%41et"  # the password really contains '%41'
    with server.connect() as admin:
        admin.execute(
            sql.SQL("ALTER ROLE {} PASSWORD {}").format(
                sql.Identifier(PASSWORD_USER), sql.Literal(literal)
            )
        )
    name = server.create_database()
    make_table(server.dsn(name))
    url = f"postgresql+psycopg://{PASSWORD_USER}:S3cr%2541et@127.0.0.1:{server.port}/{name}"
    sink = PostgresSink(url + "?sslmode=disable", "orders", name="orders", pipeline=PIPE)
    run_epoch(sink, txn(1), [{"k": "a", "v": 1}])
    assert rows_of(server.dsn(name), "SELECT k FROM orders") == [("a",)]
    wrong = PostgresSink(url.replace("2541", "2542"), "orders", name="orders", pipeline=PIPE)
    with pytest.raises(ConfigurationError) as err:
        wrong.setup()
    assert "password authentication failed" in str(err.value)
    assert "S3cr" not in str(err.value)
