"""The expected state's column types: from the sink's table, explicit, or inferred and widened.

A store table's types are fixed once it exists, so a type guessed from the
first epoch's values (``Decimal("123.45")`` as ``decimal128(5,2)``) stopped a
pipeline at the commit point of the first epoch with a wider value. These
tests run real pipelines (real PostgreSQL, SQLite, Delta tables on disk) and
read what the store wrote from disk, never from the engine's bookkeeping.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pytest
import sqlalchemy as sa
from deltalake import DeltaTable

from expected_state.store import ExpectedStateStore
from reconcile import CommitCycle, CommitFatal, CommitSucceeded, drive
from reconcile.core.contract import Change, ConfigurationError, InvalidInputError, RetryableError
from reconcile.core.value_forms import refused_columns
from reconcile.engine.expected import ExpectedState
from reconcile.recovery.api import recover
from sinks.memory.sink import MemorySink, MemoryStore
from sinks.postgres.factory import postgres_sink
from sinks.sql.sink import SqlSink

pytestmark = pytest.mark.integration

ORDERS = (
    "CREATE TABLE orders (order_id bigint PRIMARY KEY, amount numeric(12,2), "
    "rate numeric(6,4), qty int4, note text, _epoch bigint)"
)


def _stored(root: Path, sink: str = "orders") -> pa.Schema:
    """The store table's schema as its Delta log on disk says it."""
    return pa.schema(DeltaTable(str(root / "shop" / sink)).schema().to_arrow())


def _versions(root: Path, sink: str = "orders") -> int:
    return DeltaTable(str(root / "shop" / sink)).version()


def _pg_rows(dsn: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT order_id, amount, _epoch FROM orders ORDER BY 1").fetchall()
    return [tuple(r) for r in rows]


def _pg_markers(dsn: str) -> list[int]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT epoch FROM reconcile.reconcile_commits ORDER BY 1").fetchall()
    return [r[0] for r in rows]


def _pg_cycle(dsn: str, root: Path, **expected: Any) -> CommitCycle:
    state = ExpectedState(str(root), "shop", {"orders": ["order_id"]}, **expected)
    return CommitCycle("shop", [postgres_sink(dsn, "orders", name="orders")], expected_state=state)


def test_later_epochs_with_wider_decimals_run_through_and_the_store_has_the_sink_types(
    pg_db: str, tmp_path: Path
) -> None:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute(ORDERS)
    amounts = [Decimal("123.45"), Decimal("123456.78"), Decimal("9999999999.99")]

    def outputs(epoch: int) -> Mapping[str, list[dict[str, Any]]]:
        # rate is NULL in every row of the first epoch: no value to infer it from.
        rate = None if epoch == 0 else Decimal("0.1234")
        row = {"order_id": epoch, "amount": amounts[epoch], "rate": rate, "qty": 7, "note": "n"}
        return {"orders": [row]}

    report = drive(lambda: _pg_cycle(pg_db, tmp_path), range(3), outputs)

    assert report.committed_epochs == [0, 1, 2]
    stored = _stored(tmp_path)
    assert [(f.name, f.type) for f in stored][:5] == [
        ("order_id", pa.int64()),
        ("amount", pa.decimal128(12, 2)),
        ("rate", pa.decimal128(6, 4)),
        ("qty", pa.int32()),
        ("note", pa.string()),
    ]
    assert "_epoch" in stored.names and stored.names.count("_epoch") == 1  # the store's own
    assert _pg_rows(pg_db) == [(e, amounts[e], e) for e in range(3)]
    # The sink and the store agree row for row, hashed in the store's types.
    check = recover(pg_db, str(tmp_path), "shop", "orders", mode="full", dry_run=True)
    assert (check.missing, check.extra, check.changed, check.rows_pulled) == (0, 0, 0, 3)


@pytest.mark.parametrize(
    ("amount", "why"),
    [
        (Decimal("10000000000.00"), "must be below 1E10"),  # one digit past numeric(12,2)
        (Decimal("1.005"), "3 digit(s) after the decimal point"),  # one place too many
    ],
)
def test_a_value_the_store_cannot_hold_is_refused_at_stage_time(
    pg_db: str, tmp_path: Path, amount: Decimal, why: str
) -> None:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute(ORDERS)
    cycle = _pg_cycle(pg_db, tmp_path)
    cycle.start()
    first = {"order_id": 1, "amount": Decimal("1.50"), "rate": None, "qty": 1, "note": "a"}
    assert cycle.run_epoch(0, {"orders": [first]}) == CommitSucceeded(0)
    version = _versions(tmp_path)

    row = {"order_id": 2, "amount": amount, "rate": None, "qty": 1, "note": "b"}
    result = cycle.run_epoch(1, {"orders": [row]})

    assert isinstance(result, CommitFatal) and result.step == "stage"
    assert isinstance(result.error, InvalidInputError) and not result.restart
    message = str(result.error)
    for part in ("sink 'orders'", "epoch 1", "'amount'", repr(amount), why):
        assert part in message, (part, message)
    assert "decimal128(12, 2)" in message and "numeric(12,2)" in message  # both types
    # Nothing was decided, recorded or written: no Delta commit, no progress
    # entry for the epoch, no sink row and no marker.
    assert _versions(tmp_path) == version
    assert cycle.progress.status(1) is None
    assert _pg_rows(pg_db) == [(1, Decimal("1.50"), 0)]
    assert _pg_markers(pg_db) == [0]
    cycle.close()
    # drive() stops at once with the same error (no retry can make it fit).
    with pytest.raises(InvalidInputError, match="'amount'"):
        drive(lambda: _pg_cycle(pg_db, tmp_path), [1], lambda e: {"orders": [row]})
    # (its start() claimed the store table for a new generation: a commit without data)
    store = ExpectedStateStore(str(tmp_path), "shop", "orders", ["order_id"])
    assert list(store.epoch_versions()) == [0] and _pg_markers(pg_db) == [0]


def test_an_explicit_schema_wins_over_the_sink_table(pg_db: str, tmp_path: Path) -> None:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE orders (order_id bigint PRIMARY KEY, amount numeric(12,2))")
    narrow = pa.schema([("order_id", pa.int64()), ("amount", pa.decimal128(5, 2))])
    cycle = _pg_cycle(pg_db, tmp_path, schemas={"orders": narrow})
    cycle.start()  # an explicit schema is taken as it is, even one narrower than the sink's
    assert cycle.run_epoch(
        0, {"orders": [{"order_id": 1, "amount": Decimal("999.99")}]}
    ) == CommitSucceeded(0)
    assert _stored(tmp_path).field("amount").type == pa.decimal128(5, 2)

    result = cycle.run_epoch(1, {"orders": [{"order_id": 2, "amount": Decimal("1000")}]})

    assert isinstance(result, CommitFatal) and result.step == "stage"
    assert "decimal128(5, 2)" in str(result.error) and "numeric(12,2)" in str(result.error)
    cycle.close()
    # A later run with the same schema starts: explicit, it is not checked against the sink.
    again = _pg_cycle(pg_db, tmp_path, schemas={"orders": narrow})
    again.start()
    again.close()


def test_an_existing_store_narrower_than_the_sink_is_refused_at_start(
    pg_db: str, tmp_path: Path
) -> None:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE orders (order_id bigint PRIMARY KEY, amount numeric(12,2), qty int8)"
        )
    # A store table as a first epoch's values once made it: decimal128(5,2), int32.
    narrow = pa.schema(
        [("order_id", pa.int64()), ("amount", pa.decimal128(5, 2)), ("qty", pa.int32())]
    )
    old = ExpectedStateStore(str(tmp_path), "shop", "orders", ["order_id"], schema=narrow)
    old.apply(0, [Change("upsert", {"order_id": 1, "amount": Decimal("123.45"), "qty": 1})])
    version = _versions(tmp_path)

    cycle = _pg_cycle(pg_db, tmp_path)
    with pytest.raises(ConfigurationError) as refused:
        cycle.start()

    message = str(refused.value)
    assert "column 'amount' is decimal128(5, 2) in the store but numeric(12,2)" in message
    assert "column 'qty' is int32 in the store but bigint" in message
    assert refused.value.details["column"] == "amount"
    assert cycle.generation is None  # refused before a generation was claimed
    assert _versions(tmp_path) == version
    cycle.close()


def test_the_sql_sink_gives_its_types_too(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/shop.db"
    with sa.create_engine(url).begin() as conn:
        conn.exec_driver_sql(
            "CREATE TABLE orders (order_id INTEGER PRIMARY KEY, amount NUMERIC(12, 2), "
            "name TEXT, _epoch BIGINT)"
        )
    root = tmp_path / "expected"

    def build() -> CommitCycle:
        state = ExpectedState(str(root), "shop", {"orders": ["order_id"]})
        sink = SqlSink(url, "orders", name="orders")
        return CommitCycle("shop", [sink], expected_state=state)

    amounts = [Decimal("1.25"), Decimal("1234567.89")]
    rows = [{"order_id": e, "amount": amounts[e], "name": "x"} for e in range(2)]
    report = drive(build, range(2), lambda e: {"orders": [rows[e]]})

    assert report.committed_epochs == [0, 1]
    assert [(f.name, f.type) for f in _stored(root)][:3] == [
        ("order_id", pa.int64()),
        ("amount", pa.decimal128(12, 2)),
        ("name", pa.string()),
    ]
    cycle = build()
    cycle.start()
    result = cycle.run_epoch(2, {"orders": [{"order_id": 9, "amount": Decimal("1e10")}]})
    assert isinstance(result, CommitFatal) and result.step == "stage"
    assert "decimal128(12, 2)" in str(result.error) and "NUMERIC(12, 2)" in str(result.error)
    cycle.close()
    with sa.create_engine(url).connect() as conn:
        assert conn.exec_driver_sql("SELECT count(*) FROM orders").scalar() == 2


def test_a_sink_without_a_table_has_its_decimals_inferred_and_widened(tmp_path: Path) -> None:
    system = MemoryStore()

    def build() -> CommitCycle:
        state = ExpectedState(str(tmp_path), "shop", {"orders": ["order_id"]})
        return CommitCycle("shop", [MemorySink("orders", system)], expected_state=state)

    amounts = [Decimal("123.45"), Decimal("123456.78"), Decimal("1" + "0" * 35 + ".25")]
    rows = [{"order_id": e, "amount": amounts[e]} for e in range(3)]
    report = drive(build, range(3), lambda e: {"orders": [rows[e]]})

    assert report.committed_epochs == [0, 1, 2]
    # The scale of the first values is kept; the precision is the widest the hash takes.
    assert _stored(tmp_path).field("amount").type == pa.decimal128(38, 2)
    cycle = build()
    cycle.start()
    version = _versions(tmp_path)
    result = cycle.run_epoch(3, {"orders": [{"order_id": 3, "amount": Decimal("0.125")}]})
    assert isinstance(result, CommitFatal) and result.step == "stage"
    assert "decimal128(38, 2)" in str(result.error) and "Decimal('0.125')" in str(result.error)
    assert _versions(tmp_path) == version and cycle.progress.status(3) is None
    cycle.close()


def test_a_column_null_in_the_whole_first_epoch_is_refused_without_a_type(
    tmp_path: Path,
) -> None:
    state = ExpectedState(str(tmp_path), "shop", {"orders": ["order_id"]})
    cycle = CommitCycle("shop", [MemorySink("orders", MemoryStore())], expected_state=state)
    cycle.start()
    result = cycle.run_epoch(0, {"orders": [{"order_id": 1, "note": None}]})
    assert isinstance(result, CommitFatal) and result.step == "stage"
    assert "'note' is NULL in every upsert" in str(result.error)
    assert not (tmp_path / "shop" / "orders").exists()  # no store table was created


def test_an_empty_first_epoch_takes_the_sink_tables_columns(pg_db: str, tmp_path: Path) -> None:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE orders (order_id bigint PRIMARY KEY, amount numeric(12,2))")
    cycle = _pg_cycle(pg_db, tmp_path)
    cycle.start()
    # No rows at all: the schema comes from the sink.
    assert cycle.run_epoch(0, {}) == CommitSucceeded(0)
    row = {"order_id": 1, "amount": Decimal("5")}
    assert cycle.run_epoch(1, {"orders": [row]}) == CommitSucceeded(1)
    cycle.close()
    stored = _stored(tmp_path)
    assert stored.field("amount").type == pa.decimal128(12, 2)
    assert stored.field("order_id").type == pa.int64()


def test_changes_converted_for_another_schema_are_not_recorded(tmp_path: Path) -> None:
    types = pa.schema([("id", pa.int64()), ("v", pa.decimal128(12, 2))])
    ours = ExpectedStateStore(str(tmp_path), "shop", "t", ["id"], column_types=types)
    net = ours.normalize([Change("upsert", {"id": 1, "v": Decimal("1.5")})])
    # Another writer creates the table with other types meanwhile.
    other = pa.schema([("id", pa.int64()), ("v", pa.decimal128(20, 4))])
    ExpectedStateStore(str(tmp_path), "shop", "t", ["id"], schema=other).apply(
        0, [Change("upsert", {"id": 1, "v": Decimal("1.5")})]
    )
    version = _versions(tmp_path, "t")
    with pytest.raises(RetryableError, match="converted to"):
        ours.apply(1, net)
    assert _versions(tmp_path, "t") == version
    assert ExpectedStateStore(str(tmp_path), "shop", "t", ["id"]).last_epoch() == 0


def test_the_postgres_sink_maps_each_column_type(pg_db: str) -> None:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE t (a int2 PRIMARY KEY, b int4, c int8, d numeric(12,2), e numeric, "
            "f numeric(50,2), g float4, h float8, i bool, j text, k varchar(5), l char(3), "
            "m uuid, n date, o timestamp, p timestamptz, q bytea, r jsonb, s interval, "
            "u int[], v int8 GENERATED ALWAYS AS (c * 2) STORED, "
            "w int8 GENERATED ALWAYS AS IDENTITY, x int8 GENERATED BY DEFAULT AS IDENTITY, "
            "_epoch bigint)"
        )
    sink = postgres_sink(pg_db, "t", name="t")
    schema = sink.arrow_schema()
    sink.close()
    assert {f.name: f.type for f in schema} == {
        "a": pa.int16(),
        "b": pa.int32(),
        "c": pa.int64(),
        "d": pa.decimal128(12, 2),
        "e": pa.decimal128(38, 18),
        "g": pa.float32(),
        "h": pa.float64(),
        "i": pa.bool_(),
        "j": pa.string(),
        "k": pa.string(),
        "l": pa.string(),
        "m": pa.string(),
        "n": pa.date32(),
        "o": pa.timestamp("us"),
        "p": pa.timestamp("us", tz="UTC"),
        "q": pa.binary(),
        "r": pa.string(),  # jsonb: its text, in jsonb's form
        "x": pa.int64(),  # BY DEFAULT: a writer may give it
    }
    assert schema.field("d").metadata == {b"sql_type": b"numeric(12,2)"}
    # No form: the sink checks the length against the column as the epoch finds it.
    assert schema.field("k").metadata == {b"sql_type": b"character varying(5)"}
    forms = {f.name: f.metadata.get(b"value_form") for f in schema}
    assert (forms["l"], forms["m"], forms["r"]) == (b"bpchar(3)", b"uuid", b"jsonb")
    # The types the engine cannot hold are named, with why, for the store to refuse.
    assert sorted(refused_columns(schema)) == ["f", "s", "u"]


def test_an_existing_store_that_holds_the_sink_types_starts(pg_db: str, tmp_path: Path) -> None:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE orders (order_id int4 PRIMARY KEY, amount numeric(12,2))")
    wide = pa.schema([("order_id", pa.int64()), ("amount", pa.decimal128(14, 2))])
    ExpectedStateStore(str(tmp_path), "shop", "orders", ["order_id"], schema=wide).apply(
        0, [Change("upsert", {"order_id": 1, "amount": Decimal("1")})]
    )
    cycle = _pg_cycle(pg_db, tmp_path)
    cycle.start()  # a wider store holds every value of the sink's columns
    big = {"order_id": 2, "amount": Decimal("9999999999.99")}
    assert isinstance(cycle.run_epoch(1, {"orders": [big]}), CommitSucceeded)
    cycle.close()
    assert _stored(tmp_path).field("amount").type == pa.decimal128(14, 2)


def test_one_shot_outputs_reach_both_the_store_and_a_durable_sink(tmp_path: Path) -> None:
    system = MemoryStore()
    state = ExpectedState(str(tmp_path), "shop", {"orders": ["order_id"]})
    cycle = CommitCycle("shop", [MemorySink("orders", system)], expected_state=state)
    cycle.start()
    rows = ({"order_id": i, "amount": Decimal(i)} for i in range(3))  # read once only
    assert cycle.run_epoch(0, {"orders": rows}) == CommitSucceeded(0)
    [(_, committed)] = system.committed.values()
    assert [r["order_id"] for r in committed] == [0, 1, 2]
    recorded = ExpectedStateStore(str(tmp_path), "shop", "orders", ["order_id"]).snapshot()
    assert recorded.column("order_id").to_pylist() == [0, 1, 2]
