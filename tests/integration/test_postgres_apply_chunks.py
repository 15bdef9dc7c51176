"""Postgres sink: epochs go out in bounded chunks; a row too large is refused, not retried."""

from __future__ import annotations

import io
import secrets
import tracemalloc
from collections.abc import Iterator
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

from reconcile.core.contract import OK, Change, Fatal, SinkOutcome, SinkTxnId
from sinks.postgres import apply, values
from sinks.postgres.apply import ChunkLimits
from sinks.postgres.prepared import PreparedPostgresSink
from sinks.postgres.sink import PostgresSink
from tests.fix_pg import PgServer

pytestmark = pytest.mark.integration

PIPE = "pipe"
MODES = [PostgresSink, PreparedPostgresSink]


def one_epoch(sink: PostgresSink, rows: Any, epoch: int) -> SinkOutcome:
    txn = SinkTxnId(PIPE, sink.name, epoch, 0)
    assert sink.stage(txn, rows) == OK
    outcome = sink.prepare(txn)
    if outcome != OK:
        return outcome
    return sink.commit(txn)


def wide_table(n: int, offset: int = 0) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(range(offset, offset + n), pa.int64()),
            "note": pa.array([f"row {i:08d} " + "x" * 40 for i in range(n)]),
        }
    )


@pytest.mark.parametrize("fast_path", [True, False])
def test_copy_holds_one_csv_slice_at_a_time(
    pg_db: str, monkeypatch: pytest.MonkeyPatch, fast_path: bool
) -> None:
    limits = ChunkLimits(rows=10_000, bytes=256 << 10)
    monkeypatch.setattr(apply, "COPY_CHUNK", limits)
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id bigint PRIMARY KEY, note text)")
        if not fast_path:
            conn.execute("INSERT INTO t VALUES (100000, 'taken')")  # the key range is not free
    table = wide_table(200_000)
    whole = io.BytesIO()
    pacsv.write_csv(table, whole, pacsv.WriteOptions(include_header=False))
    csv_bytes = len(whole.getvalue())
    del whole
    assert csv_bytes > 10_000_000
    sink = PostgresSink(pg_db, "t", name="t", pipeline=PIPE)
    txn = SinkTxnId(PIPE, "t", 1, 0)
    assert sink.stage(txn, table) == OK
    sink.setup()
    tracemalloc.start()
    try:
        assert sink.prepare(txn) == OK
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert sink.commit(txn) == OK
    sink.close()
    # The client held about one slice of CSV (plus small change), never the
    # epoch's whole CSV, which is 40 times larger.
    assert peak < 4 * limits.bytes, (peak, csv_bytes)
    with psycopg.connect(pg_db, autocommit=True) as conn:
        assert conn.execute("SELECT count(*), max(id) FROM t").fetchone() == (200_000, 199_999)


@pytest.fixture(scope="module")
def stats_server() -> Iterator[PgServer]:
    """A server that counts every statement it runs (pg_stat_statements)."""
    server = PgServer(shared_preload_libraries="pg_stat_statements")
    yield server
    server.stop()


def statements(dsn: str, verb: str) -> int:
    """How many statements starting with ``verb`` on the target the server ran."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements "
            "WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) "
            "AND query LIKE %s",
            (f"{verb} % ROWS FROM (pg_catalog.unnest(%",),
        ).fetchone()
    assert row is not None
    return int(row[0])


def test_prepared_mode_sends_bounded_statements_in_one_transaction(
    stats_server: PgServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = stats_server.create_database("st")
    try:
        dsn = stats_server.dsn(db)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION pg_stat_statements")
            conn.execute("CREATE TABLE t (id bigint PRIMARY KEY, note text, _epoch bigint)")
            conn.execute("SELECT pg_stat_statements_reset()")
        monkeypatch.setattr(apply, "ARRAY_CHUNK", ChunkLimits(rows=1_000, bytes=1 << 30))
        sink = PreparedPostgresSink(dsn, "t", name="t", pipeline=PIPE)
        dict_rows = [{"id": i, "note": f"d{i}"} for i in range(2_500)]
        assert one_epoch(sink, dict_rows, 1) == OK  # 3 statements
        assert one_epoch(sink, wide_table(3_000, offset=10_000), 2) == OK  # 3 statements
        deletes = [Change("delete", {"id": i}) for i in range(1_500)]
        assert one_epoch(sink, deletes, 3) == OK  # 2 statements
        assert statements(dsn, "INSERT INTO") == 6
        assert statements(dsn, "DELETE FROM") == 2
        # A byte bound as well: rows of about 1 kB, at most about 64 kB a statement.
        monkeypatch.setattr(apply, "ARRAY_CHUNK", ChunkLimits(rows=1_000_000, bytes=64 << 10))
        big = [{"id": 20_000 + i, "note": "y" * 1_000} for i in range(640)]
        before = statements(dsn, "INSERT INTO")
        assert one_epoch(sink, big, 4) == OK
        sent = statements(dsn, "INSERT INTO") - before
        assert 10 <= sent <= 12, sent
        sink.close()
        with psycopg.connect(dsn, autocommit=True) as conn:
            got = conn.execute("SELECT _epoch, count(*) FROM t GROUP BY 1 ORDER BY 1").fetchall()
            marks = conn.execute(
                "SELECT epoch FROM reconcile.reconcile_commits ORDER BY 1"
            ).fetchall()
        assert got == [(1, 1_000), (2, 3_000), (4, 640)]  # epoch 3 deleted ids 0..1499
        assert marks == [(1,), (2,), (3,), (4,)]
    finally:
        stats_server.drop_database(db)


@pytest.mark.parametrize("mode", MODES)
def test_a_row_too_large_to_send_is_fatal_before_anything_is_written(
    pg_db: str, monkeypatch: pytest.MonkeyPatch, mode: type
) -> None:
    monkeypatch.setattr(values, "MAX_ROW_BYTES", 10_000)
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id bigint PRIMARY KEY, note text)")
    sink = mode(pg_db, "t", name="t", pipeline=PIPE)
    small = [{"id": 1, "note": "ok"}]
    for epoch, rows, where in (
        (1, [*small, {"id": 2, "note": "z" * 20_000}], "row 1"),
        (2, [*small, {"id": 2, "note": "é" * 3_000}], "row 1"),  # 3,000 chars, up to 12 kB
        (3, wide_table(300).append_column("big", pa.array(["w" * 20_000] * 300)), "Arrow row 0"),
    ):
        if epoch == 3:
            with psycopg.connect(pg_db, autocommit=True) as conn:
                conn.execute("ALTER TABLE t ADD COLUMN IF NOT EXISTS big text")
            sink = mode(pg_db, "t", name="t", pipeline=PIPE)
        outcome = one_epoch(sink, rows, epoch)
        assert isinstance(outcome, Fatal), (epoch, outcome)
        assert f"{where} is about" in outcome.reason and "10,000 bytes" in outcome.reason
        assert "public.t" in outcome.reason and "nothing was written" in outcome.reason
    assert one_epoch(sink, wide_table(300).append_column("big", pa.array(["w"] * 300)), 4) == OK
    sink.close()
    with psycopg.connect(pg_db, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM t").fetchone() == (300,)
        assert conn.execute("SELECT epoch FROM reconcile.reconcile_commits").fetchall() == [(4,)]


@pytest.mark.parametrize("mode", MODES)
def test_a_statement_past_a_server_limit_is_fatal_not_retried(pg_db: str, mode: type) -> None:
    # An index entry larger than a btree page allows: PostgreSQL answers 54000
    # (program_limit_exceeded), and the same data would fail on every retry.
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (k text PRIMARY KEY)")
    sink = mode(pg_db, "t", name="t", pipeline=PIPE)
    outcome = one_epoch(sink, [{"k": secrets.token_hex(10_000)}], 1)
    sink.close()
    assert isinstance(outcome, Fatal), outcome
    assert "[54000]" in outcome.reason and "nothing was written" in outcome.reason
    with psycopg.connect(pg_db, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM t").fetchone() == (0,)
