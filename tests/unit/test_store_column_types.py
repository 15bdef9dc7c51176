"""Where a store table's types come from, as pure functions: no store, no database."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest
import sqlalchemy as sa

from expected_state.changes import normalize_changes
from expected_state.column_types import (
    check_store_types,
    holds,
    infer_user_schema,
    widen_inferred,
)
from reconcile.core.contract import Change, ConfigurationError, InvalidInputError
from sinks.sql.arrow_types import arrow_type, table_arrow_schema

D = pa.decimal128


@pytest.mark.parametrize(
    ("store", "sink", "expected"),
    [
        (D(12, 2), D(12, 2), True),
        (D(14, 2), D(12, 2), True),
        (D(13, 3), D(12, 2), True),  # one more digit on each side
        (D(12, 3), D(12, 2), False),  # one digit fewer before the point
        (D(5, 2), D(12, 2), False),  # the first epoch's guess
        (D(12, 1), D(12, 2), False),  # a place fewer after the point
        (D(19, 0), pa.int64(), True),
        (D(18, 0), pa.int64(), False),
        (D(10, 0), pa.int32(), True),
        (D(38, 2), pa.float64(), False),  # a float is not exact in a decimal
        (pa.int64(), pa.int32(), True),
        (pa.int32(), pa.int64(), False),
        (pa.int64(), D(12, 2), False),
        (pa.int64(), pa.uint32(), True),
        (pa.int32(), pa.uint32(), False),
        (pa.uint64(), pa.int8(), False),
        (pa.float64(), pa.float32(), True),
        (pa.float32(), pa.float64(), False),
        (pa.large_string(), pa.string(), True),
        (pa.string(), pa.int64(), False),
        (pa.binary(), pa.large_binary(), True),
        (pa.timestamp("us", tz="Europe/Paris"), pa.timestamp("us", tz="UTC"), True),
        (pa.timestamp("ns"), pa.timestamp("us"), True),
        (pa.timestamp("us"), pa.timestamp("us", tz="UTC"), False),
        (pa.date32(), pa.date64(), True),
        (pa.bool_(), pa.bool_(), True),
        (pa.dictionary(pa.int32(), pa.string()), pa.string(), True),
    ],
)
def test_holds(store: pa.DataType, sink: pa.DataType, expected: bool) -> None:
    assert holds(store, sink) is expected


def test_an_inferred_decimal_keeps_its_scale_and_gets_38_digits() -> None:
    assert widen_inferred(D(5, 2)) == D(38, 2)
    assert widen_inferred(D(38, 38)) == D(38, 38)
    assert widen_inferred(pa.int64()) == pa.int64()
    assert widen_inferred(pa.dictionary(pa.int8(), D(3, 1))) == D(38, 1)


def test_the_sinks_types_win_over_the_values_and_keys_come_first() -> None:
    data = pa.schema([("amount", D(5, 2)), ("id", pa.int64()), ("note", pa.null())])
    types = pa.schema(
        [
            pa.field("id", pa.int32(), metadata={"sql_type": "integer"}),
            pa.field("amount", D(12, 2), metadata={"sql_type": "numeric(12,2)"}),
            pa.field("note", pa.string()),
            pa.field("other", pa.string()),  # not given by the rows: not stored
        ]
    )
    schema = infer_user_schema(data, ["id"], types, table="t")
    assert schema == pa.schema([("id", pa.int32()), ("amount", D(12, 2)), ("note", pa.string())])
    assert all(f.metadata is None for f in schema)  # the sink's type names stay out of Delta
    inferred = infer_user_schema(data.remove(2), ["id"], None, table="t")
    assert inferred == pa.schema([("id", pa.int64()), ("amount", D(38, 2))])


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (pa.schema([("id", pa.int64()), ("v", pa.null())]), "'v' is NULL in every upsert"),
        (pa.schema([("id", pa.int64()), ("v", pa.list_(pa.int64()))]), "row hash"),
        (pa.schema([("v", pa.int64())]), "lack key column 'id'"),
    ],
)
def test_a_type_that_cannot_be_inferred_is_refused(data: pa.Schema, message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        infer_user_schema(data, ["id"], None, table="t")


def test_a_narrow_store_is_refused_naming_every_column_and_both_types() -> None:
    store = pa.schema([("id", pa.int32()), ("amount", D(5, 2)), ("note", pa.string())])
    types = pa.schema(
        [
            pa.field("id", pa.int64(), metadata={"sql_type": "bigint"}),
            pa.field("amount", D(12, 2), metadata={"sql_type": "numeric(12,2)"}),
        ]
    )
    with pytest.raises(ConfigurationError) as refused:
        check_store_types(store, types, table="root/p/orders", sink="orders")
    message = str(refused.value)
    assert "column 'id' is int32 in the store but bigint in the sink" in message
    assert "column 'amount' is decimal128(5, 2) in the store but numeric(12,2)" in message
    assert refused.value.details["column"] == "id"
    check_store_types(store, pa.schema([("amount", D(4, 1))]), table="t", sink="orders")


def _upserts(*rows: dict[str, Any]) -> list[Change]:
    return [Change("upsert", r) for r in rows]


def test_values_are_converted_to_the_sinks_types_and_a_misfit_names_both() -> None:
    types = pa.schema(
        [
            pa.field("id", pa.int64()),
            pa.field("amount", D(12, 2), metadata={"sql_type": "numeric(12,2)"}),
            pa.field("qty", pa.int16(), metadata={"sql_type": "smallint"}),
        ]
    )
    net, schema = normalize_changes(
        _upserts({"id": 1, "amount": Decimal("1.5"), "qty": 3}),
        keys=["id"], schema=None, table="t", types=types,
    )  # fmt: skip
    assert schema.field("amount").type == D(12, 2) and net.upserts.num_rows == 1
    wide = _upserts({"id": 1, "amount": 1, "qty": 3}, {"id": 2, "amount": 1, "qty": 40000})
    with pytest.raises(InvalidInputError) as refused:
        normalize_changes(wide, keys=["id"], schema=schema, table="t", types=types)
    message = str(refused.value)
    assert "'qty' value 40000 (row 1)" in message
    assert "int16 (the sink column is smallint)" in message
    assert refused.value.details["value"] == "40000"


def test_ints_beside_decimals_take_the_known_type() -> None:
    schema = pa.schema([("id", pa.int64()), ("amount", D(12, 2))])
    rows = _upserts({"id": 1, "amount": Decimal("1.5")}, {"id": 2, "amount": 2.25})
    net, _ = normalize_changes(rows, keys=["id"], schema=schema, table="t")
    assert net.upserts.column("amount").to_pylist() == [Decimal("1.50"), Decimal("2.25")]
    with pytest.raises(InvalidInputError, match="'amount' value 'x'"):
        bad = _upserts({"id": 1, "amount": Decimal("1.5")}, {"id": 2, "amount": "x"})
        normalize_changes(bad, keys=["id"], schema=schema, table="t")


@pytest.mark.parametrize(
    ("column", "dialect", "expected"),
    [
        (sa.Column("a", sa.BigInteger()), "postgresql", pa.int64()),
        (sa.Column("a", sa.Integer()), "postgresql", pa.int32()),
        (sa.Column("a", sa.SmallInteger()), "postgresql", pa.int16()),
        (sa.Column("a", sa.Integer()), "sqlite", pa.int64()),  # SQLite's integers are 64-bit
        (sa.Column("a", sa.Numeric(12, 2)), "sqlite", D(12, 2)),
        (sa.Column("a", sa.Numeric()), "postgresql", D(38, 18)),
        (sa.Column("a", sa.Numeric(50, 2)), "postgresql", None),
        (sa.Column("a", sa.REAL()), "postgresql", pa.float32()),
        (sa.Column("a", sa.REAL()), "sqlite", pa.float64()),
        (sa.Column("a", sa.Float()), "postgresql", pa.float64()),
        (sa.Column("a", sa.Boolean()), "sqlite", pa.bool_()),
        (sa.Column("a", sa.String(5)), "sqlite", pa.string()),
        (sa.Column("a", sa.Uuid()), "postgresql", pa.string()),
        (sa.Column("a", sa.Date()), "sqlite", pa.date32()),
        (sa.Column("a", sa.DateTime()), "sqlite", pa.timestamp("us")),
        (sa.Column("a", sa.DateTime(timezone=True)), "postgresql", pa.timestamp("us", "UTC")),
        (sa.Column("a", sa.LargeBinary()), "sqlite", pa.binary()),
        (sa.Column("a", sa.JSON()), "sqlite", None),
        (sa.Column("a", sa.Interval()), "postgresql", None),
    ],
)
def test_sql_column_types(column: sa.Column[Any], dialect: str, expected: Any) -> None:
    assert arrow_type(column, dialect) == expected


def test_the_sql_schema_leaves_out_epoch_and_computed_columns() -> None:
    table = sa.Table(
        "t",
        sa.MetaData(),
        sa.Column("id", sa.BigInteger(), primary_key=True),
        sa.Column("amount", sa.Numeric(12, 2)),
        sa.Column("twice", sa.BigInteger(), sa.Computed("id * 2")),
        sa.Column("doc", sa.JSON()),
        sa.Column("_epoch", sa.BigInteger()),
    )
    schema = table_arrow_schema(table, "sqlite")
    assert schema.names == ["id", "amount"]
    assert schema.field("amount").metadata == {b"sql_type": b"NUMERIC(12, 2)"}
