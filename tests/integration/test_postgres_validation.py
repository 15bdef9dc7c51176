"""Postgres sink: every bad input is refused before anything is written, with a precise error."""

from __future__ import annotations

import datetime as dt
import uuid
from decimal import Decimal
from typing import Any

import psycopg
import pyarrow as pa
import pytest

from reconcile.core.contract import OK, Change, ConfigurationError, Fatal, SinkTxnId
from sinks.postgres.prepared import PreparedPostgresSink
from sinks.postgres.sink import PostgresSink

pytestmark = pytest.mark.integration

PIPE = "pipe"
DDL = (
    "CREATE TABLE items (id bigint PRIMARY KEY, name varchar(5) NOT NULL, qty int4, "
    "price numeric(10,2), at timestamptz, tag uuid, doc jsonb, _epoch bigint)"
)
GOOD = {"id": 1, "name": "ok", "qty": 1, "price": 1.5, "at": None, "tag": None, "doc": None}


def row(**changes: Any) -> dict[str, Any]:
    return {**GOOD, **changes}


# (case, staged rows, the column the error must name, a fragment of the value shown)
CASES: list[tuple[str, list[Any], str, str]] = [
    ("missing column", [row(colour="red")], "colour", "red"),
    ("int as str", [row(qty="3")], "qty", "'3'"),
    ("bool for int", [row(qty=True)], "qty", "True"),
    ("int4 out of range", [row(qty=2**31)], "qty", str(2**31)),
    ("text too long", [row(name="toolong")], "name", "toolong"),
    ("NUL in text", [row(name="a\x00")], "name", "a\\x00"),
    ("not a uuid", [row(tag="nope")], "tag", "nope"),
    ("naive timestamptz", [row(at=dt.datetime(2024, 1, 1))], "at", "2024"),
    ("not JSON", [row(doc={1, 2})], "doc", "{1, 2}"),
    ("NULL key", [row(id=None)], "id", "None"),
    ("NULL in NOT NULL", [row(name=None)], "name", "None"),
    ("NOT NULL column missing", [{"id": 1}], "name", ""),
    ("key column missing", [{"name": "x"}], "id", ""),
    ("duplicate keys", [row(id=7), row(id=7, name="b")], "id", "7"),
    ("upsert and delete of one key", [row(id=8), Change("delete", {"id": 8})], "id", "8"),
    ("delete without key", [Change("delete", {"name": "x"})], "id", "None"),
    ("ragged columns", [row(id=1), {"id": 2, "name": "x"}], "at", ""),
    ("_epoch given", [row(_epoch=3)], "_epoch", "3"),
    ("decimal that would round", [row(price=Decimal("1.005"))], "price", "1.005"),
    ("float that would round", [row(price=1.005)], "price", "1.005"),
    ("numeric overflow", [row(price=Decimal("123456789.5"))], "price", "123456789.5"),
    ("NaN into numeric", [row(price=float("nan"))], "price", "nan"),
    ("arrow: wrong type", [pa.table({"id": [1], "name": [5]})], "name", "int64"),
    ("arrow: NULL key", [pa.table({"id": pa.array([1, None]), "name": ["a", "b"]})], "id", ""),
    ("arrow: duplicate keys", [pa.table({"id": [4, 4], "name": ["a", "b"]})], "id", "4"),
    ("arrow: missing column", [pa.table({"id": [1], "name": ["a"], "zz": [1]})], "zz", ""),
    (
        "arrow + dict duplicate",
        [
            row(id=9),
            pa.table(
                {
                    "id": [9],
                    "name": ["a"],
                    "qty": [1],
                    "price": [1.0],
                    "at": pa.array([None], pa.null()),
                    "tag": pa.array([None], pa.null()),
                    "doc": pa.array([None], pa.null()),
                }
            ),
        ],
        "id",
        "9",
    ),
]


@pytest.fixture
def items(pg_db: str) -> str:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute(DDL)
    return pg_db


def nothing_written(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM items").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM reconcile.reconcile_commits").fetchone() == (0,)


@pytest.mark.parametrize("mode", [PostgresSink, PreparedPostgresSink])
def test_every_bad_input_is_refused_with_nothing_written(items: str, mode: type) -> None:
    sink = mode(items, "items", name="items", pipeline=PIPE)
    for epoch, (case, rows, column, value) in enumerate(CASES):
        txn = SinkTxnId(PIPE, "items", epoch, 0)
        staged = sink.stage(txn, rows)
        outcome = staged if not staged else sink.prepare(txn)
        assert isinstance(outcome, Fatal), (case, outcome)
        reason = outcome.reason
        assert "public.items" in reason, (case, reason)
        assert f"column {column!r}" in reason, (case, reason)
        assert value in reason, (case, reason)
        assert "nothing was written" in reason, (case, reason)
        assert sink.abort(txn) == OK
        nothing_written(items)
    assert list(sink.recover()) == []


@pytest.mark.parametrize("mode", [PostgresSink, PreparedPostgresSink])
def test_valid_values_of_every_kind_are_written(items: str, mode: type) -> None:
    sink = mode(items, "items", name="items", pipeline=PIPE)
    txn = SinkTxnId(PIPE, "items", 1, 0)
    tag = uuid.uuid4()
    rows = [
        row(
            id=1,
            price=2,
            at=dt.datetime(2024, 1, 1, tzinfo=dt.UTC),
            tag=str(tag),
            doc={"a": [1, "x"]},
        ),
        row(id=2, name="héé", qty=-5, price=None, doc='"s"'),  # JSON text: a JSON string
    ]
    assert sink.stage(txn, rows) == OK and sink.prepare(txn) == OK and sink.commit(txn) == OK
    with psycopg.connect(items, autocommit=True) as conn:
        got = conn.execute(
            "SELECT id, name, qty, price::text, tag, doc, _epoch FROM items ORDER BY id"
        ).fetchall()
    assert got == [
        (1, "ok", 1, "2.00", tag, {"a": [1, "x"]}, 1),
        (2, "héé", -5, None, None, "s", 1),
    ]


def test_server_side_rejection_is_fatal_and_rolled_back(items: str) -> None:
    # A CHECK constraint is only known to the server: the error comes back
    # from inside the txn, which is rolled back, so nothing is written either.
    with psycopg.connect(items, autocommit=True) as conn:
        conn.execute("ALTER TABLE items ADD CONSTRAINT qty_positive CHECK (qty > 0)")
    sink = PostgresSink(items, "items", name="items", pipeline=PIPE)
    txn = SinkTxnId(PIPE, "items", 1, 0)
    assert sink.stage(txn, [row(id=1), row(id=2, qty=-1)]) == OK
    outcome = sink.prepare(txn)
    assert isinstance(outcome, Fatal)
    assert "qty_positive" in outcome.reason and "nothing was written" in outcome.reason
    nothing_written(items)


def test_unusable_targets_are_configuration_errors(pg_db: str) -> None:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE nokey (a int)")
    for table in ("absent", "nokey"):
        sink = PostgresSink(pg_db, table, name="s", pipeline=PIPE)
        with pytest.raises(ConfigurationError) as err:
            sink.setup()
        assert table in str(err.value)
        txn = SinkTxnId(PIPE, "s", 1, 0)
        assert sink.stage(txn, [{"a": 1}]) == OK
        outcome = sink.prepare(txn)
        assert isinstance(outcome, Fatal) and table in outcome.reason
    with pytest.raises(ConfigurationError):
        PostgresSink(pg_db, "nokey", name="bad-name", pipeline=PIPE)
    other = PostgresSink(pg_db, "nokey", name="s", pipeline=PIPE)
    outcome = other.prepare(SinkTxnId(PIPE, "t", 1, 0))
    assert isinstance(outcome, Fatal) and "another sink" in outcome.reason


def test_commit_rejected_by_a_deferred_constraint_is_fatal(items: str) -> None:
    with psycopg.connect(items, autocommit=True) as conn:
        conn.execute("CREATE TABLE parent (id int PRIMARY KEY)")
        conn.execute(
            "ALTER TABLE items ADD CONSTRAINT qty_fk FOREIGN KEY (qty) "
            "REFERENCES parent (id) DEFERRABLE INITIALLY DEFERRED"
        )
    sink = PostgresSink(items, "items", name="items", pipeline=PIPE)
    txn = SinkTxnId(PIPE, "items", 1, 0)
    assert sink.stage(txn, [row(id=1, qty=42)]) == OK
    assert sink.prepare(txn) == OK  # the FK is checked only at COMMIT
    outcome = sink.commit(txn)
    assert isinstance(outcome, Fatal) and "qty_fk" in outcome.reason
    assert "nothing was written" in outcome.reason
    nothing_written(items)


def arrow_prices(prices: pa.Array) -> pa.Table:
    n = len(prices)
    return pa.table({"id": pa.array(range(n), pa.int64()), "name": ["a"] * n, "price": prices})


# (case, staged rows, the value shown) — each would be rounded by PostgreSQL.
MISFITS: list[tuple[str, list[Any], str]] = [
    ("dict Decimal", [row(id=1), row(id=2, price=Decimal("1.005"))], "Decimal('1.005')"),
    ("dict float", [row(price=1.005)], "1.005"),
    ("dict int overflow", [row(price=10**8)], str(10**8)),
    ("dict Decimal overflow", [row(price=Decimal("99999999.995"))], "99999999.995"),
    ("arrow decimal", [arrow_prices(pa.array([Decimal("1.5"), Decimal("1.005")]))], "1.005"),
    ("arrow float", [arrow_prices(pa.array([1.1, 2.25, 0.1 + 0.2]))], "0.30000000000000004"),
    ("arrow float32", [arrow_prices(pa.array([1.5, 0.1], pa.float32()))], "0.10000000149"),
    ("arrow int overflow", [arrow_prices(pa.array([1, 10**8], pa.int64()))], str(10**8)),
    (
        "arrow decimal overflow",
        [arrow_prices(pa.array([Decimal("123456789.00")], pa.decimal128(11, 2)))],
        "123456789",
    ),
]


@pytest.mark.parametrize("mode", [PostgresSink, PreparedPostgresSink])
def test_a_value_that_would_be_rounded_is_refused_naming_the_declared_type(
    items: str, mode: type
) -> None:
    # PostgreSQL rounds Decimal('1.005') into numeric(10,2) to 1.01 without a
    # word; the expected state refuses it. The sink refuses it too, before
    # anything is written, by the same rule (reconcile/core/decimals.py).
    sink = mode(items, "items", name="items", pipeline=PIPE)
    for epoch, (case, rows, value) in enumerate(MISFITS):
        txn = SinkTxnId(PIPE, "items", epoch, 0)
        assert sink.stage(txn, rows) == OK, case
        outcome = sink.prepare(txn)
        assert isinstance(outcome, Fatal), (case, outcome)
        reason = outcome.reason
        for fragment in ("public.items", "column 'price'", value, "numeric(10,2)", "exactly"):
            assert fragment in reason, (case, fragment, reason)
        assert "refused rather than rounded" in reason and "nothing was written" in reason
        assert sink.abort(txn) == OK
        nothing_written(items)


@pytest.mark.parametrize("mode", [PostgresSink, PreparedPostgresSink])
def test_values_that_fit_numeric_exactly_are_written_exactly(items: str, mode: type) -> None:
    sink = mode(items, "items", name="items", pipeline=PIPE)
    dict_rows = [
        row(id=1, price=Decimal("1.5")),
        row(id=2, price=Decimal("1.500")),  # trailing zeros are no digits lost
        row(id=3, price=1.1),
        row(id=4, price=-99999999),
        row(id=5, price=Decimal("99999999.99")),
    ]
    txn = SinkTxnId(PIPE, "items", 1, 0)
    assert sink.stage(txn, dict_rows) == OK and sink.prepare(txn) == OK
    assert sink.commit(txn) == OK
    arrow = pa.table(
        {
            "id": pa.array([11, 12, 13, 14], pa.int64()),
            "name": ["a"] * 4,
            "price": pa.array([Decimal("1.500"), Decimal("0.010"), None, Decimal("-2.000")]),
        }
    )
    floats = pa.table(
        {"id": pa.array([21, 22], pa.int64()), "name": ["b", "c"], "price": [1.1, 2.25]}
    )
    for epoch, rows in ((2, arrow), (3, floats)):
        txn = SinkTxnId(PIPE, "items", epoch, 0)
        assert sink.stage(txn, rows) == OK and sink.prepare(txn) == OK
        assert sink.commit(txn) == OK
    with psycopg.connect(items, autocommit=True) as conn:
        got = conn.execute("SELECT id, price::text FROM items ORDER BY id").fetchall()
    assert got == [
        (1, "1.50"),
        (2, "1.50"),
        (3, "1.10"),
        (4, "-99999999.00"),
        (5, "99999999.99"),
        (11, "1.50"),
        (12, "0.01"),
        (13, None),
        (14, "-2.00"),
        (21, "1.10"),
        (22, "2.25"),
    ]


def test_declared_precision_and_scale_are_read_from_the_catalog(pg_db: str) -> None:
    # PostgreSQL 15 allows a negative scale (rounding to tens, hundreds...) and
    # a scale above the precision; the rule reads both from the typmod.
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE odd (id int PRIMARY KEY, hundreds numeric(5,-2), tiny numeric(3,5), "
            "free numeric)"
        )
    sink = PostgresSink(pg_db, "odd", name="odd", pipeline=PIPE)
    good = {"id": 1, "hundreds": 9_999_900, "tiny": Decimal("0.00999"), "free": 2**80}
    txn = SinkTxnId(PIPE, "odd", 1, 0)
    assert sink.stage(txn, [good]) == OK and sink.prepare(txn) == OK and sink.commit(txn) == OK
    for epoch, (column, value, declared) in enumerate(
        [
            ("hundreds", 12_350, "numeric(5,-2)"),
            ("hundreds", 10**7, "numeric(5,-2)"),
            ("tiny", Decimal("0.01"), "numeric(3,5)"),
            ("tiny", Decimal("0.000001"), "numeric(3,5)"),
        ],
        start=2,
    ):
        txn = SinkTxnId(PIPE, "odd", epoch, 0)
        assert sink.stage(txn, [{**good, "id": epoch, column: value}]) == OK
        outcome = sink.prepare(txn)
        assert isinstance(outcome, Fatal), (column, value, outcome)
        assert f"column {column!r}" in outcome.reason and declared in outcome.reason
        assert sink.abort(txn) == OK
    with psycopg.connect(pg_db, autocommit=True) as conn:
        got = conn.execute("SELECT hundreds::text, tiny::text, free::text FROM odd").fetchall()
    assert got == [("9999900", "0.00999", str(2**80))]


def test_a_typo_in_one_rows_column_names_the_misspelt_column(pg_db: str) -> None:
    # A new user's typo in row 2 was reported against the correct column 'amount'.
    from reconcile.core.contract import SinkTxnId
    from sinks.postgres.factory import postgres_sink

    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE pay (id int PRIMARY KEY, amount int)")
    sink = postgres_sink(pg_db, "pay", name="pay")
    txn = SinkTxnId("p", "pay", 0)
    rows = [{"id": 1, "amount": 5}, {"id": 2, "amount": 6}, {"id": 3, "amuont": 7}]
    assert sink.stage(txn, rows)
    outcome = sink.prepare(txn)
    assert not outcome
    assert "column 'amuont'" in outcome.reason and "upsert 2" in outcome.reason, outcome.reason
    assert "column 'amount'" not in outcome.reason
    sink.close()
