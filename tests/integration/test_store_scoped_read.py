"""The store's snapshot restricted to some keys equals the full snapshot's rows of those keys.

Scoped recovery reads the expected state this way; a restriction that kept a
stale base row, or lost a key whose newest change is in a change file, would
make a repair write the wrong value.
"""

from __future__ import annotations

import random
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from expected_state.store import ExpectedStateStore
from reconcile.core.contract import Change
from reconcile.recovery.source import ExpectedSource


def _sorted(table: pa.Table, keys: list[str]) -> list[dict[str, object]]:
    return table.sort_by([(k, "ascending") for k in keys]).to_pylist()


def test_a_snapshot_of_some_keys_is_the_full_snapshot_of_those_keys(tmp_path: Path) -> None:
    store = ExpectedStateStore(str(tmp_path), "p", "t", ["a", "b"])
    store.apply(0, [Change("upsert", {"a": i, "b": "x", "v": i}) for i in range(50)])
    store.compact(through_epoch=0)  # epoch 0 in the base, later epochs in change files
    store.apply(1, [Change("upsert", {"a": i, "b": "x", "v": 100 + i}) for i in range(0, 50, 3)])
    store.apply(2, [Change("delete", {"a": i, "b": "x", "v": None}) for i in range(1, 50, 7)])
    store.apply(3, [Change("upsert", {"a": i, "b": "y", "v": -i}) for i in range(5)])
    wanted = pa.table(
        {"a": [0, 1, 2, 3, 4, 8, 49, 1000], "b": ["x", "x", "y", "x", "y", "x", "x", "x"]}
    )
    for epoch in (1, 2, 3):
        full = store.snapshot(epoch)
        hit = pc.is_in(
            pc.binary_join_element_wise(pc.cast(full["a"], pa.string()), full["b"], "|"),
            value_set=pc.binary_join_element_wise(
                pc.cast(wanted["a"], pa.string()), wanted["b"], "|"
            ),
        )
        expected = full.filter(hit)
        got = store.snapshot(epoch, keys=wanted)
        assert got.num_rows == expected.num_rows > 0, epoch
        assert _sorted(got, ["a", "b"]) == _sorted(expected, ["a", "b"]), epoch
    # A deleted key, and keys never written, give no row.
    assert store.snapshot(3, keys=pa.table({"a": [1, 1000], "b": ["x", "x"]})).num_rows == 0


def _rows_of(table: pa.Table, scope: set[int]) -> list[dict[str, object]]:
    hit = pc.is_in(table["a"], value_set=pa.array(sorted(scope), pa.int64()))
    return _sorted(table.filter(hit).select(["a", "b", "v", "_row_hash"]), ["a"])


def test_scoped_recovery_reads_the_state_of_its_keys_at_any_epoch_from_any_marker(
    tmp_path: Path,
) -> None:
    """What scoped recovery reads (newest changes since the marker, the rest from a
    snapshot) equals the snapshot at the target epoch, through folds and merges."""
    rng = random.Random(11)
    store = ExpectedStateStore(str(tmp_path), "p", "t", ["a"])
    for epoch in range(12):
        changes = []
        for a in rng.sample(range(40), 8):
            if rng.random() < 0.25:
                changes.append(Change("delete", {"a": a, "b": None, "v": None}))
            else:
                changes.append(Change("upsert", {"a": a, "b": f"e{epoch}", "v": rng.randint(0, 9)}))
        store.apply(epoch, changes)
        if epoch == 4:
            store.compact(through_epoch=2)  # epochs 0..2 folded into the base
        if epoch == 8:
            store.compact_changes()  # the change files so far merged into one
    source = ExpectedSource(store, values=True)
    checked = 0
    for since in range(-1, 11):
        for epoch in range(max(since, 0), 12):
            scope = set(rng.sample(range(45), 15))
            keys = pa.table({"a": pa.array(sorted(scope), pa.int64())})
            got = source.of_keys(epoch, ["a"], keys, since)
            assert _rows_of(got, scope) == _rows_of(store.snapshot(epoch), scope), (since, epoch)
            assert got.num_rows == len(_rows_of(got, scope))  # nothing outside the scope
            checked += 1
    assert checked > 60
