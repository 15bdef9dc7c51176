"""compact_changes() merges runs of small change files, bounded, and leaves the large ones alone.

A store whose epochs mostly insert has changes as large as the table: a merge of
every change file would read the table again at every merge. The epochs here
have 1 to 6 rows, merged with ``max_rows=10`` (a file of 5 rows or more is
large), and keys that change on both sides of a large epoch: a run that
spanned it would put an older change after a newer one.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from expected_state.store import ExpectedStateStore
from reconcile.core.contract import Change, InvalidInputError

pytestmark = pytest.mark.integration

SCHEMA = pa.schema([("k", pa.string()), ("v", pa.int64())])
# Rows per epoch: 3 is large (6 >= 10 // 2), 4..7 pack two a run (4 + 4 <= 10 < 12), 8 is newest.
SIZES = {1: 2, 2: 2, 3: 6, 4: 4, 5: 4, 6: 4, 7: 4, 8: 1}


def changes_of(e: int, size: int) -> list[Change]:
    rows = [Change("upsert", {"k": "x", "v": e}), Change("upsert", {"k": "y", "v": e})]
    rows += [Change("upsert", {"k": f"e{e}-{i}", "v": e}) for i in range(size - 2)]
    if e == 5:
        rows[-1] = Change("delete", {"k": "e4-0"})  # a tombstone inside a run
    return rows[:size]


def as_map(table: pa.Table) -> dict[str, int]:
    return {r["k"]: r["v"] for r in table.to_pylist()}


def names(store: ExpectedStateStore) -> list[str]:
    return sorted(Path(u).name for u in DeltaTable(store.uri).file_uris())


def ranges(store: ExpectedStateStore) -> list[tuple[int, int]]:
    """(first, last) epoch of every live change file, oldest first."""
    found = []
    for name in names(store):
        parts = name.split("-")
        epochs = [int(p[1:]) for p in parts[1:3] if p.startswith("e") and p[1:].isdigit()]
        found.append((epochs[0], epochs[-1]))
    return sorted(found)


def build(root: Path) -> tuple[ExpectedStateStore, dict[int, dict[str, int]]]:
    store = ExpectedStateStore(str(root), "pipe", "t", ["k"], schema=SCHEMA)
    states = {}
    for e, size in SIZES.items():
        store.apply(e, changes_of(e, size))
        states[e] = as_map(store.snapshot())
    return store, states


def test_runs_of_small_files_are_merged_and_a_large_file_is_left_alone(tmp_path: Path) -> None:
    store, states = build(tmp_path)
    large = [n for n in names(store) if n.startswith("change-e000000000003-")]
    report = store.compact_changes(max_rows=10)
    assert report["through_epoch"] == 7
    assert (report["runs"], report["merged_files"]) == (3, 6)
    assert ranges(store) == [(1, 2), (3, 3), (4, 5), (6, 7), (8, 8)]
    assert large[0] in names(store)  # not read, not rewritten
    for e, state in states.items():
        assert as_map(store.snapshot(e)) == state, e
    assert as_map(store.snapshot()) == states[8]
    # Again, with two more epochs: only what is small and beside another is merged.
    merged_4_5 = [n for n in names(store) if n.startswith("change-e000000000004-e")]
    for e in (9, 10):
        store.apply(e, changes_of(e, 1))
        states[e] = as_map(store.snapshot())
    report = store.compact_changes(max_rows=10)
    # (1, 2) holds 2 rows (small) but its neighbour is large; (4, 5) holds 5 rows and
    # (6, 7) 6: large, as a run closed by the bound makes them. Only 8 and 9 merge.
    assert (report["runs"], report["merged_files"]) == (1, 2)
    assert ranges(store) == [(1, 2), (3, 3), (4, 5), (6, 7), (8, 9), (10, 10)]
    assert merged_4_5[0] in names(store)
    for e, state in states.items():
        assert as_map(store.snapshot(e)) == state, e


def test_maintain_merges_only_when_enough_files_would_be_merged(tmp_path: Path) -> None:
    store = ExpectedStateStore(str(tmp_path), "pipe", "t", ["k"], schema=SCHEMA)
    # Large and small epochs in turn: no small file has a small neighbour.
    for e in range(1, 9):
        rows = 6 if e % 2 else 1
        store.apply(e, [Change("upsert", {"k": f"k{e}-{i}", "v": e}) for i in range(rows)])
        done = store.maintain(compact_changes_after=2, merge_max_rows=10)
        assert "compact_changes" not in done, (e, done)
    # Two small epochs side by side (9 and 10), then a newer one: now a merge is due.
    for e in (9, 10, 11):
        store.apply(e, [Change("upsert", {"k": f"k{e}", "v": e})])
    done = store.maintain(compact_changes_after=2, merge_max_rows=10)
    assert done["compact_changes"]["merged_files"] == 3  # 8, 9 and 10
    assert ranges(store)[-2:] == [(8, 10), (11, 11)]
    assert len(as_map(store.snapshot())) == 4 * 6 + 4 + 3


def test_a_merge_bound_of_less_than_two_rows_is_refused(tmp_path: Path) -> None:
    store, _ = build(tmp_path)
    with pytest.raises(InvalidInputError, match="max_rows must be at least 2"):
        store.compact_changes(max_rows=1)
    assert ranges(store) == [(e, e) for e in SIZES]
