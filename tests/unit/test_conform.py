"""Pulled rows in the expected state's types: a value that does not convert flags its row.

A flag is kept per row across every column (and the puller's own flags), so
that each row with a value that does not fit gets a hash matching nothing:
drift, never a row taken for equal.
"""

from __future__ import annotations

from decimal import Decimal

import pyarrow as pa

from reconcile.core.conform import UNCONVERTIBLE, conform, hash_pulled

SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("price", pa.decimal128(5, 2)),
        pa.field("qty", pa.int32()),
    ]
)


def _pulled(**extra: pa.Array) -> pa.Table:
    return pa.table(
        {
            "id": pa.array([1, 2, 3], pa.int64()),
            # Row 0 has a place more than the store's decimal(5,2): it does not convert.
            "price": pa.array(
                [Decimal("1.234"), Decimal("2.5"), Decimal("3")], pa.decimal128(6, 3)
            ),
            # Row 1 is beyond int32.
            "qty": pa.array([1, 2**40, 3], pa.int64()),
            **extra,
        }
    )


def test_each_column_flags_its_own_rows() -> None:
    rows, bad = conform(_pulled(), SCHEMA)
    assert bad is not None and bad.tolist() == [True, True, False]
    assert rows.schema == SCHEMA
    assert rows.column("price").to_pylist() == [None, Decimal("2.50"), Decimal("3.00")]
    assert rows.column("qty").to_pylist() == [1, None, 3]


def test_the_pullers_flags_are_kept_beside_the_columns() -> None:
    _, bad = conform(_pulled(**{UNCONVERTIBLE: pa.array([False, False, True])}), SCHEMA)
    assert bad is not None and bad.tolist() == [True, True, True]


def test_a_flagged_row_hashes_to_nothing_an_equal_row_would() -> None:
    rows, bad = conform(_pulled(), SCHEMA)
    flagged = hash_pulled(rows, bad, SCHEMA.names).to_pylist()
    plain = hash_pulled(rows, None, SCHEMA.names).to_pylist()
    assert [f != p for f, p in zip(flagged, plain, strict=True)] == [True, True, False]
