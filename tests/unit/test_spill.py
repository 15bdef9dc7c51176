"""Spilled parts: each row in the part its key hashes to, in order; the folder always removed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from reconcile.core.contract import InvalidInputError
from reconcile.core.spill import SpilledParts, parts_for, parts_of


def test_parts_for_rounds_up_and_keeps_one() -> None:
    assert [parts_for(n, 100) for n in (0, 1, 100, 101, 200, 201)] == [1, 1, 1, 2, 2, 3]
    with pytest.raises(InvalidInputError, match="chunk_rows"):
        parts_for(10, 0)


def test_equal_keys_share_a_part_whatever_the_other_columns() -> None:
    left = pa.table({"a": ["x", "y", "z"] * 50, "b": list(range(150)), "h": [1] * 150})
    right = pa.table({"h": [2] * 150, "b": list(range(150)), "a": ["x", "y", "z"] * 50})
    assert (parts_of(left, ["a", "b"], 7) == parts_of(right, ["a", "b"], 7)).all()
    # Several columns at once: a part is not the first column's alone.
    assert len(set(parts_of(left, ["a", "b"], 7).tolist())) == 7
    assert (parts_of(left, ["a", "b"], 1) == 0).all()


def test_rows_are_read_back_by_part_in_the_order_added(tmp_path: Path) -> None:
    schema = pa.schema([("k", pa.int64()), ("n", pa.int64())])
    with SpilledParts(schema, 5, where=str(tmp_path)) as spill:
        for start in (0, 100, 200):
            batch = pa.table({"k": list(range(start, start + 100)), "n": [start] * 100})
            spill.add(batch, parts_of(batch, ["k"], 5))
        spill.add(schema.empty_table(), np.zeros(0, dtype=np.int64))
        got = dict(spill.each())
        assert sorted(got) == [0, 1, 2, 3, 4] and spill.rows == 300
        keys = [k for t in got.values() for k in t.column("k").to_pylist()]
        assert sorted(keys) == list(range(300))
        for part, table in got.items():
            assert table.schema == schema
            assert (parts_of(table, ["k"], 5) == part).all()
            assert table.column("k").to_pylist() == sorted(table.column("k").to_pylist())
        folder = spill.folder
    assert not folder.exists()


def test_an_empty_part_has_the_schema_and_an_error_removes_the_folder(tmp_path: Path) -> None:
    schema = pa.schema([("k", pa.int64())])
    with pytest.raises(RuntimeError), SpilledParts(schema, 3, where=str(tmp_path)) as spill:
        spill.add(pa.table({"k": [4]}), np.array([1]))
        assert spill.read(0).schema == schema and spill.read(0).num_rows == 0
        assert spill.read(1).column("k").to_pylist() == [4]
        raise RuntimeError("interrupted")
    assert list(tmp_path.iterdir()) == []
