"""The store's rebase: the difference a new state makes, found by each of its three ways.

One integer key with the same keys in the same order (compared in place), one
integer key with keys inserted, deleted and in another order (a sorted
search), and a text key or several key columns (a hash join): each is
checked against a difference worked out row by row in Python, then
committed, and the store's snapshot must equal the new state, with the rows
the new state left alone keeping their epoch.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
import pytest
from deltalake import DeltaTable

from expected_state.live import live_files
from expected_state.rebasing import REBASE_WRITTEN
from expected_state.store import ExpectedStateStore
from reconcile.core import hooks
from reconcile.core.contract import FencedError, InvalidInputError
from reconcile.core.hashing import row_hash_arrow

pytestmark = pytest.mark.integration


def _store(root: Path, keys: list[str], epochs: list[pa.Table]) -> ExpectedStateStore:
    store = ExpectedStateStore(str(root), "shop", "t", keys, generation=1)
    for epoch, rows in enumerate(epochs):
        store.apply(epoch, rows.append_column("_op", pa.repeat(pa.scalar("upsert"), rows.num_rows)))
    return store


def _rows(table: pa.Table, keys: list[str]) -> dict[tuple[Any, ...], dict[str, Any]]:
    return {tuple(r[k] for k in keys): r for r in table.to_pylist()}


def _check(store: ExpectedStateStore, new: pa.Table, keys: list[str]) -> None:
    old = _rows(store.snapshot(None, store.user_schema.names), keys)  # type: ignore[union-attr]
    epochs = {k: r["_epoch"] for k, r in _rows(store.snapshot(), keys).items()}
    wanted = _rows(new, keys)
    through = store.last_epoch()
    assert through is not None
    rebase = store.prepare_rebase(new, through=through)
    assert set(_rows(rebase.inserted, keys)) == set(wanted) - set(old)
    assert set(_rows(rebase.deletes, keys)) == set(old) - set(wanted)
    changed = {k for k in wanted if k in old and old[k] != wanted[k]}
    assert set(_rows(rebase.changed, keys)) == changed
    assert set(_rows(rebase.upserts, keys)) == (set(wanted) - set(old)) | changed
    names = store.user_schema.names  # type: ignore[union-attr]
    assert rebase.hashes.to_pylist() == row_hash_arrow(rebase.upserts, names).to_pylist()
    store.rebase(rebase, label="test-rebase", metadata={})
    # One live file holds epoch ``through``, as merge-on-read needs: the rebase's.
    holding = [f for f in live_files(DeltaTable(store.uri), name=store.uri)
               if f.kind == "change" and f.epoch == through]  # fmt: skip
    assert len(holding) == 1
    after = _rows(store.snapshot(), keys)
    assert {k: {c: v for c, v in r.items() if not c.startswith("_")} for k, r in after.items()} == {
        k: {c: r[c] for c in sorted(r)} for k, r in wanted.items()
    }
    for k, r in after.items():
        assert r["_epoch"] == (through if k not in old or old[k] != wanted[k] else epochs[k])


def test_the_same_keys_in_the_same_order(tmp_path: Path) -> None:
    first = pa.table({"id": list(range(0, 50)), "v": [i * 2 for i in range(50)]})
    second = pa.table({"id": list(range(50, 100)), "v": [i * 2 for i in range(50, 100)]})
    store = _store(tmp_path, ["id"], [first, second])
    new = pa.table({"id": list(range(100)), "v": [i * 2 + (i % 7 == 0) for i in range(100)]})
    _check(store, new, ["id"])


def test_keys_inserted_deleted_and_shuffled(tmp_path: Path) -> None:
    store = _store(tmp_path, ["id"], [pa.table({"id": list(range(40)), "v": list(range(40))}),
                                      pa.table({"id": [5, 50], "v": [500, 50]})])  # fmt: skip
    ids = [i for i in range(60) if i % 4 != 1]  # 1, 5, 9, ... deleted; 40..59 new
    random.Random(7).shuffle(ids)
    new = pa.table({"id": ids, "v": [i if i % 3 else -i for i in ids]})
    _check(store, new, ["id"])


def test_a_text_key_and_several_key_columns(tmp_path: Path) -> None:
    store = _store(tmp_path / "text", ["name"],
                   [pa.table({"name": ["a", "b", "c"], "v": [1, 2, 3]})])  # fmt: skip
    _check(store, pa.table({"name": ["d", "c", "a"], "v": [4, 30, 1]}), ["name"])
    composite = _store(tmp_path / "two", ["region", "id"],
                       [pa.table({"region": ["eu", "eu", "us"], "id": [1, 2, 1],
                                  "v": [1, 2, 3]})])  # fmt: skip
    _check(composite, pa.table({"region": ["us", "eu", "us"], "id": [1, 2, 2], "v": [3, 20, 5]}),
           ["region", "id"])  # fmt: skip


def test_a_new_state_that_repeats_a_key_is_refused(tmp_path: Path) -> None:
    store = _store(tmp_path, ["id"], [pa.table({"id": [1, 2], "v": [1, 2]})])
    with pytest.raises(InvalidInputError, match="more than once"):
        store.prepare_rebase(pa.table({"id": [1, 1], "v": [1, 2]}), through=0)
    two = _store(tmp_path / "two", ["a", "b"], [pa.table({"a": [1], "b": [1], "v": [1]})])
    with pytest.raises(InvalidInputError, match="1 repeated keys"):
        two.prepare_rebase(pa.table({"a": [1, 1], "b": [2, 2], "v": [1, 2]}), through=0)


def test_a_takeover_that_lands_before_the_rebases_commit_fences_it(tmp_path: Path) -> None:
    store = _store(tmp_path, ["id"], [pa.table({"id": [1, 2], "v": [1, 2]})])
    rebase = store.prepare_rebase(pa.table({"id": [1, 2], "v": [1, 20]}), through=0)

    def takeover() -> None:
        ExpectedStateStore(str(tmp_path), "shop", "t", ["id"], generation=2).claim()

    with hooks.at(REBASE_WRITTEN, takeover) as armed, pytest.raises(FencedError):
        store.rebase(rebase, label="zombie", metadata={})
    assert armed.fired == 1
    assert store.rebased_by("zombie") is None  # no commit of it in the Delta log
    assert {r["id"]: r["v"] for r in store.snapshot(0, ["id", "v"]).to_pylist()} == {1: 1, 2: 2}


def test_an_epoch_in_a_merged_file_keeps_one_live_file_per_epoch(tmp_path: Path) -> None:
    # Key 0 is written by every epoch; the others by one each.
    epochs = [pa.table({"id": [0, *range(e * 10 + 1, e * 10 + 10)], "v": [e] * 10})
              for e in range(5)]  # fmt: skip
    store = _store(tmp_path, ["id"], epochs)
    store.compact_changes(through_epoch=4)  # epochs 0..4, the newest too, in one merged file

    def covering() -> dict[int, list[str]]:
        files = [f for f in live_files(DeltaTable(store.uri), name=store.uri) if f.kind == "change"]
        return {e: [f.path for f in files if f.first <= e <= f.epoch] for e in range(5)}

    [merged] = {p for paths in covering().values() for p in paths}
    assert all(paths == [merged] for paths in covering().values())
    new = pa.table({"id": [0, *range(1, 40)], "v": [-1, *range(1, 40)]})  # 40..49 deleted
    _check(store, new, ["id"])
    # The rebase replaced the merged file by one merged file again: each epoch
    # 0..4 is in exactly one live file, whose name says the epochs it holds.
    after = covering()
    [rebased] = {p for paths in after.values() for p in paths}
    assert rebased != merged and all(paths == [rebased] for paths in after.values()), after
    reader = ExpectedStateStore(str(tmp_path), "shop", "t", ["id"])
    assert {r["id"]: r["v"] for r in reader.snapshot(4, ["id", "v"]).to_pylist()} == {
        r["id"]: r["v"] for r in new.to_pylist()
    }  # read through the store's own checks of the files and their names
    reader.check_version(DeltaTable(reader.uri).version())
