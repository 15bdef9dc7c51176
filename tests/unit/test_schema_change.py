"""The rules of in-place schema changes (``reconcile.core.schema_change``), one family at a time."""

from __future__ import annotations

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
import pytest

from reconcile.core.schema_change import (
    SchemaChangeRefused,
    declared_length,
    plan_schema_change,
    widens,
)

KEYS = ["id"]
BASE = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("qty", pa.int32()),
        pa.field("total", pa.decimal128(10, 2)),
        pa.field("ratio", pa.float32()),
        pa.field("name", pa.string()),
    ]
)


def _with(**changed: pa.Field | None) -> pa.Schema:
    fields = {f.name: f for f in BASE}
    fields.update(changed)
    return pa.schema([f for f in fields.values() if f is not None])


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        (pa.int16(), pa.int32(), True),
        (pa.int32(), pa.int64(), True),
        (pa.int16(), pa.int64(), True),
        (pa.int64(), pa.int32(), False),
        (pa.int32(), pa.int32(), False),
        (pa.uint32(), pa.int64(), False),
        (pa.float32(), pa.float64(), True),
        (pa.float64(), pa.float32(), False),
        (pa.int32(), pa.float64(), False),
        (pa.decimal128(10, 2), pa.decimal128(18, 4), True),
        (pa.decimal128(10, 2), pa.decimal128(12, 2), True),
        (pa.decimal128(10, 2), pa.decimal128(11, 3), True),  # 8 digits before the point either way
        (pa.decimal128(10, 2), pa.decimal128(10, 3), False),  # one digit fewer before the point
        (pa.decimal128(10, 2), pa.decimal128(12, 1), False),  # a digit fewer after the point
        (pa.decimal128(10, 2), pa.decimal128(9, 2), False),
        (pa.string(), pa.int64(), False),
    ],
)
def test_widens(old: pa.DataType, new: pa.DataType, expected: bool) -> None:
    assert widens(old, new) is expected


def test_no_change_is_none() -> None:
    assert plan_schema_change(BASE, BASE, KEYS, table="t") is None
    # Nullability and metadata of an existing column are no change.
    assert plan_schema_change(BASE, _with(qty=pa.field("qty", pa.int32(), False)), KEYS,
                              table="t") is None  # fmt: skip


def test_new_nullable_columns_and_widenings_at_once() -> None:
    after = _with(
        qty=pa.field("qty", pa.int64()),
        total=pa.field("total", pa.decimal128(18, 4)),
        note=pa.field("note", pa.string()),
        score=pa.field("score", pa.float64()),
    )
    change = plan_schema_change(BASE, after, KEYS, table="t")
    assert change is not None
    assert change.added == ("note", "score") and change.widened == ("qty", "total")
    assert "adds 'note' (string)" in change.describe()
    assert "widens 'qty' int32 -> int64" in change.describe()


@pytest.mark.parametrize(
    ("after", "column", "words"),
    [
        (_with(id=None), "id", "key column and the new schema drops it"),
        (_with(id=pa.field("id", pa.int32(), False)), "id", "retypes it"),
        (_with(id=pa.field("id", pa.string(), False)), "id", "retypes it"),
        (_with(qty=None), "qty", "is dropped"),
        (_with(qty=pa.field("qty", pa.int16())), "qty", "not a widening"),
        (_with(total=pa.field("total", pa.decimal128(10, 1))), "total", "not a widening"),
        (_with(ratio=pa.field("ratio", pa.float16())), "ratio", "not a widening"),
        (_with(name=pa.field("name", pa.int64())), "name", "not a widening"),
        (_with(note=pa.field("note", pa.string(), nullable=False)), "note", "NOT NULL"),
    ],
)
def test_refused_changes_name_the_column(after: pa.Schema, column: str, words: str) -> None:
    with pytest.raises(SchemaChangeRefused, match=words) as err:
        plan_schema_change(BASE, after, KEYS, table="t")
    assert err.value.details["column"] == column
    assert "rebuild the sink (docs/changing.md)" in str(err.value)
    assert "nothing was written" in str(err.value)


def _named(sql_type: str | None) -> pa.Field:
    metadata = None if sql_type is None else {"sql_type": sql_type}
    return pa.field("name", pa.string(), metadata=metadata)


@pytest.mark.parametrize(
    ("before", "after", "outcome"),
    [
        ("character varying(10)", "text", "widened"),
        ("character varying(10)", "varchar(40)", "widened"),
        ("character varying(10)", "varchar(10)", None),
        ("text", "text", None),
        (None, None, None),
        ("character varying(10)", None, None),  # nothing declared: the sink keeps its type
        ("character varying(10)", "varchar(5)", "refused"),
        ("text", "varchar(40)", "refused"),
    ],
)
def test_declared_string_types(before: str | None, after: str | None, outcome: str | None) -> None:
    old, new = _with(name=_named(before)), _with(name=_named(after))
    if outcome == "refused":
        with pytest.raises(SchemaChangeRefused, match="narrows"):
            plan_schema_change(old, new, KEYS, table="t")
        return
    change = plan_schema_change(old, new, KEYS, table="t")
    assert (change.widened if change else None) == (("name",) if outcome else None)


def test_declared_length() -> None:
    assert declared_length("varchar(12)") == 12
    assert declared_length("character varying(3)") == 3
    assert declared_length("text") is None
    assert declared_length("integer") is False
    assert declared_length(None) is False
