"""A store snapshot read in parts by key hash equals the snapshot read whole, at every epoch.

The parts are what a bounded-memory full verify reads: each key in exactly one
part, every part merged alone (base, merged change files, single-epoch change
files, deletes), for the newest epoch and for older ones read by time travel.
"""

from __future__ import annotations

import random
from pathlib import Path

import pyarrow as pa
import pytest

from expected_state.store import ExpectedStateStore
from reconcile.core.contract import Change, InvalidInputError
from reconcile.core.spill import parts_of

pytestmark = pytest.mark.integration

SCHEMA = pa.schema([("a", pa.string()), ("b", pa.int32()), ("v", pa.float64())])
KEYS = ["a", "b"]
COLUMNS = ["a", "b", "v", "_row_hash", "_epoch"]


def rows_of(table: pa.Table) -> set[tuple[object, ...]]:
    return {tuple(r[c] for c in COLUMNS) for r in table.select(COLUMNS).to_pylist()}


def build(root: Path) -> ExpectedStateStore:
    """Eight epochs over 300 keys of two columns, compacted after the fourth."""
    store = ExpectedStateStore(str(root), "pipe", "t", KEYS, schema=SCHEMA)
    rng = random.Random(5)
    keys = [(f"k{i % 17}", i) for i in range(300)]
    for e in range(8):
        changes = []
        for a, b in rng.sample(keys, 120):
            kind = "delete" if rng.random() < 0.2 else "upsert"
            row = {"a": a, "b": b} if kind == "delete" else {"a": a, "b": b, "v": rng.random()}
            changes.append(Change(kind, row))
        store.apply(e, changes)
        if e == 3:
            store.compact(through_epoch=3)
    return store


@pytest.mark.parametrize("parts", [1, 2, 7, 64])
def test_the_parts_make_up_the_snapshot_at_every_epoch(tmp_path: Path, parts: int) -> None:
    store = build(tmp_path / "t")
    spill = tmp_path / "spill"
    spill.mkdir()
    for epoch in (1, 3, 5, 7, None):  # 1: before the fold, read by time travel
        whole = store.snapshot(epoch, columns=COLUMNS)
        seen: set[tuple[object, ...]] = set()
        numbered = []
        for part, table in store.snapshot_parts(epoch, COLUMNS, parts=parts, where=str(spill)):
            numbered.append(part)
            assert (parts_of(table, KEYS, parts) == part).all()
            got = rows_of(table)
            assert not got & seen and len(got) == table.num_rows
            seen |= got
        assert numbered == list(range(parts))
        assert seen == rows_of(whole) and len(seen) == whole.num_rows > 100
        assert list(spill.iterdir()) == []
    assert store.stored_rows() >= store.snapshot().num_rows


def test_an_unrecorded_epoch_is_refused_in_parts_too(tmp_path: Path) -> None:
    store = build(tmp_path / "t")
    with pytest.raises(InvalidInputError, match="epoch"):
        list(store.snapshot_parts(99, COLUMNS, parts=3))
