"""revert(epoch): an epoch recorded but never decided is undone, so that it can run again.

Checks read the Delta table itself: its token, its live files, its commits.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from expected_state.fencing import fence_app_id
from expected_state.reverting import REVERT_CHECKED
from expected_state.store import ExpectedStateStore
from reconcile.core import hooks
from reconcile.core.contract import Change, EpochOrderError, FencedError, InvalidInputError

pytestmark = pytest.mark.integration

SCHEMA = pa.schema([("k", pa.string()), ("v", pa.int64())])


def store_at(root: Path, generation: int = 0) -> ExpectedStateStore:
    return ExpectedStateStore(str(root), "pipe", "t", ["k"], schema=SCHEMA, generation=generation)


def up(k: str, v: int) -> Change:
    return Change("upsert", {"k": k, "v": v})


def token(store: ExpectedStateStore) -> int | None:
    return DeltaTable(store.uri).transaction_version("pipe/t")


def live(store: ExpectedStateStore) -> list[str]:
    return sorted(Path(u).name for u in DeltaTable(store.uri).file_uris())


def plain_rows(store: ExpectedStateStore) -> list[dict[str, object]]:
    data = pa.table(DeltaTable(store.uri).to_pyarrow_table())
    return sorted(data.select(["k", "v", "_epoch", "_op"]).to_pylist(), key=lambda r: str(r))


def as_map(table: pa.Table) -> dict[str, int]:
    return {r["k"]: r["v"] for r in table.to_pylist()}


def test_revert_then_rerun_with_other_rows_never_mixes_the_runs(tmp_path: Path) -> None:
    store = store_at(tmp_path)
    store.apply(1, [up("a", 1), up("b", 1)])
    store.apply(2, [up("a", 20), up("run1", 1), Change("delete", {"k": "b"})])
    assert store.revert(2)
    # The Delta table: epoch 2's file is gone and the token is back at 1.
    assert token(store) == 1
    assert [n.split("-")[1] for n in live(store)] == ["e000000000001"]
    assert as_map(store.snapshot()) == {"a": 1, "b": 1}
    # The re-run computes different output: only it is recorded.
    assert store.apply(2, [up("a", 22), up("run2", 2)]).applied
    assert token(store) == 2
    assert as_map(store.snapshot()) == {"a": 22, "b": 1, "run2": 2}
    assert as_map(store.snapshot(2)) == {"a": 22, "b": 1, "run2": 2}
    assert not any(r["k"] == "run1" for r in plain_rows(store))
    assert sorted(r["k"] for r in store.changes_of(2).to_pylist()) == ["a", "run2"]
    assert sorted(r["k"] for r in store.changed_keys(1).to_pylist()) == ["a", "run2"]
    fresh = store_at(tmp_path)
    assert list(fresh.epoch_versions()) == [1, 2]
    assert fresh.version_of(2) == DeltaTable(store.uri).version()


def test_revert_is_idempotent_and_refuses_an_older_epoch(tmp_path: Path) -> None:
    store = store_at(tmp_path)
    for e in (1, 2, 3):
        store.apply(e, [up(f"k{e}", e)])
    version = DeltaTable(store.uri).version()
    with pytest.raises(EpochOrderError, match=r"cannot revert epoch 2: only the newest epoch"):
        store.revert(2)
    assert DeltaTable(store.uri).version() == version and token(store) == 3
    assert store.revert(3)
    version = DeltaTable(store.uri).version()
    assert not store.revert(3)  # reverted already
    assert not store_at(tmp_path).revert(3)  # and for a restarted process
    assert not store.revert(9)  # never applied
    assert DeltaTable(store.uri).version() == version
    assert store.revert(2)  # now the newest
    assert token(store) == 1 and as_map(store.snapshot()) == {"k1": 1}


def test_reverting_the_first_epoch_leaves_no_epoch(tmp_path: Path) -> None:
    store = store_at(tmp_path)
    store.apply(5, [up("a", 1)])
    assert store.revert(5)
    assert store.last_epoch() is None and token(store) == -1
    assert store.snapshot().num_rows == 0 and live(store) == []
    assert store.apply(5, [up("b", 2)]).applied  # any first epoch again
    assert as_map(store.snapshot()) == {"b": 2}


def test_reverting_an_epoch_after_a_gap_or_without_changes(tmp_path: Path) -> None:
    store = store_at(tmp_path)
    store.apply(1, [up("a", 1)])
    store.apply(4, [up("a", 4)], allow_gap=True)
    store.apply(5, [])  # an epoch without output: no file, only the token
    assert store.revert(5) and token(store) == 4
    assert store.revert(4) and token(store) == 1  # back to the recorded epoch before the gap
    with pytest.raises(EpochOrderError, match="skips epochs"):
        store.apply(4, [up("a", 44)])
    assert store.apply(4, [up("a", 44)], allow_gap=True).applied
    assert as_map(store.snapshot(3)) == {"a": 1}


def test_a_folded_epoch_cannot_be_reverted_and_the_default_fold_keeps_the_newest(
    tmp_path: Path,
) -> None:
    store = store_at(tmp_path)
    for e in (1, 2, 3):
        store.apply(e, [up(f"k{e}", e)])
    store.compact()  # folds 1..2: epoch 3 stays revertible
    assert store.revert(3)
    store.apply(3, [up("k3", 33)])
    store.compact(through_epoch=3)  # the caller knows 3 is decided
    version = DeltaTable(store.uri).version()
    with pytest.raises(InvalidInputError, match="epoch 3 was folded into the base"):
        store.revert(3)
    assert DeltaTable(store.uri).version() == version and token(store) == 3


def test_zombie_revert_with_takeover_in_the_window_changes_nothing(tmp_path: Path) -> None:
    zombie = store_at(tmp_path, 1)
    zombie.claim()
    zombie.apply(1, [up("a", 1)])
    zombie.apply(2, [up("a", 2)])
    successor = store_at(tmp_path, 2)
    before = live(zombie)
    with hooks.at(REVERT_CHECKED, successor.claim) as window, pytest.raises(FencedError):
        zombie.revert(2)
    assert window.fired == 1
    table = DeltaTable(zombie.uri)
    assert table.transaction_version(fence_app_id("pipe", "t")) == 2  # never lowered
    assert token(zombie) == 2 and live(zombie) == before
    assert successor.revert(2)  # the new writer decides about epoch 2
    assert as_map(successor.snapshot()) == {"a": 1}


def test_a_zombie_whose_snapshot_holds_the_takeover_cannot_revert(tmp_path: Path) -> None:
    zombie = store_at(tmp_path, 1)
    zombie.claim()
    zombie.apply(1, [up("a", 1)])
    store_at(tmp_path, 2).claim()
    with pytest.raises(FencedError, match="generation 1 is fenced off by generation 2"):
        zombie.revert(1)
    assert token(zombie) == 1


def test_a_writer_sees_a_revert_made_by_another_object_after_its_own_commit(
    tmp_path: Path,
) -> None:
    # The writer knows the tokens its own last commit wrote, and may skip reading
    # them back only while the table is still at that very version.
    writer, recovery = store_at(tmp_path), store_at(tmp_path)
    writer.apply(1, [up("a", 1)])
    writer.apply(2, [up("a", 2)])
    assert recovery.revert(2)
    with pytest.raises(EpochOrderError, match=r"epoch 3 skips epochs 2\.\.2"):
        writer.apply(3, [up("a", 3)])
    assert token(writer) == 1
    assert writer.apply(2, [up("a", 22)]).applied
    assert as_map(writer.snapshot()) == {"a": 22}


def test_a_revert_after_the_log_was_pruned_moves_the_token_to_the_epoch_before(
    tmp_path: Path,
) -> None:
    store = store_at(tmp_path)
    for e in range(1, 30):  # epoch e is version e
        store.apply(e, [up(f"k{e}", e)])
    assert store.checkpoint() == 29
    store.vacuum(
        keep_epochs=1, retention_hours=0, safety_margin_minutes=0
    )  # the log is cut at that checkpoint
    fresh = store_at(tmp_path)
    assert list(fresh.epoch_versions()) == [29]  # epoch 28's commit is gone
    assert fresh.revert(29)
    assert token(fresh) == 28 and fresh.last_epoch() == 28
    assert fresh.apply(29, [up("z", 1)]).applied
    assert as_map(fresh.snapshot())["z"] == 1 and len(as_map(fresh.snapshot())) == 29
