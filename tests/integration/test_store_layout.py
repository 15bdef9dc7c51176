"""The merge-on-read layout on disk: what one epoch writes, what readers need, what is refused."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable, write_deltalake

from expected_state.merge import resolve
from expected_state.store import ExpectedStateStore
from reconcile.core.contract import Change, InvalidInputError, StoreLostRowsError

pytestmark = pytest.mark.integration

SCHEMA = pa.schema([("k", pa.string()), ("v", pa.int64())])


def store_at(root: Path) -> ExpectedStateStore:
    return ExpectedStateStore(str(root), "pipe", "t", ["k"], schema=SCHEMA)


def as_map(table: pa.Table) -> dict[str, int]:
    return {r["k"]: r["v"] for r in table.to_pylist()}


def last_commit_actions(store: ExpectedStateStore) -> list[dict[str, object]]:
    version = DeltaTable(store.uri).version()
    log = Path(store.uri) / "_delta_log" / f"{version:020d}.json"
    return [json.loads(line) for line in log.read_text().splitlines()]


def test_an_epoch_that_updates_existing_keys_adds_one_file_and_removes_none(
    tmp_path: Path,
) -> None:
    store = store_at(tmp_path)
    first = {"k": [f"k{i}" for i in range(100)], "v": list(range(100)), "_op": ["upsert"] * 100}
    store.apply(1, pa.table(first))
    store.apply(2, [Change("upsert", {"k": "x", "v": 0})])
    store.compact()
    changes = [Change("upsert", {"k": f"k{i}", "v": -i}) for i in range(0, 50)]
    changes += [Change("upsert", {"k": f"new{i}", "v": i}) for i in range(40)]
    changes += [Change("delete", {"k": f"k{i}"}) for i in range(90, 100)]
    store.apply(3, changes)
    actions = last_commit_actions(store)
    adds = [a["add"] for a in actions if "add" in a]
    assert [a for a in actions if "remove" in a] == []
    assert len(adds) == 1 and str(adds[0]["path"]).startswith("change-e000000000003-")  # type: ignore[call-overload]
    txns = {a["txn"]["appId"]: a["txn"]["version"] for a in actions if "txn" in a}  # type: ignore[index]
    assert txns == {"pipe/t": 3, "pipe/t#generation": 0}
    # The change file: 90 upserts with their hash, 10 tombstones with no values.
    everything = pa.table(DeltaTable(store.uri).to_pyarrow_table())
    rows = everything.filter(pc.equal(everything["_epoch"], 3))
    tombstones = [r for r in rows.to_pylist() if r["_op"] == "delete"]
    assert len(tombstones) == 10 and rows.num_rows == 100
    assert all(r["v"] is None and r["_row_hash"] is None for r in tombstones)
    expected = {f"k{i}": (-i if i < 50 else i) for i in range(90)}
    expected |= {f"new{i}": i for i in range(40)} | {"x": 0}
    assert as_map(store.snapshot()) == expected


def test_the_write_path_and_changed_keys_never_open_the_base(tmp_path: Path) -> None:
    store = store_at(tmp_path)
    store.apply(1, [Change("upsert", {"k": f"k{i}", "v": i}) for i in range(20)])
    store.apply(2, [Change("upsert", {"k": "k1", "v": 100})])
    store.compact()  # base folded through epoch 1
    bases = [Path(u) for u in DeltaTable(store.uri).file_uris() if Path(u).name.startswith("base-")]
    assert len(bases) == 1
    os.remove(bases[0])  # from here on, any read of the base fails
    epoch_3 = [Change("upsert", {"k": "k2", "v": 200}), Change("delete", {"k": "k3"})]
    assert store.apply(3, epoch_3).applied
    changed = {r["k"]: r["_deleted"] for r in store.changed_keys(1).to_pylist()}
    assert changed == {"k1": False, "k2": False, "k3": True}
    assert store.changes_of(3).num_rows == 2
    with pytest.raises(StoreLostRowsError, match=r"lost rows: .*base-t0+1-.* is gone"):
        store.snapshot()


def test_a_plain_delta_reader_gets_the_state_by_the_documented_rule(tmp_path: Path) -> None:
    store = store_at(tmp_path)
    store.apply(1, [Change("upsert", {"k": "a", "v": 1}), Change("upsert", {"k": "b", "v": 1})])
    store.apply(2, [Change("delete", {"k": "a"}), Change("upsert", {"k": "c", "v": 2})])
    store.compact()
    store.apply(3, [Change("upsert", {"k": "a", "v": 3}), Change("delete", {"k": "b"})])
    for epoch in (1, 2, 3):
        version = store.version_of(epoch)
        rows = pa.table(DeltaTable(store.uri, version=version).to_pyarrow_table())
        assert as_map(resolve(rows, ["k"])) == as_map(store.snapshot(epoch)), epoch
    assert as_map(resolve(pa.table(DeltaTable(store.uri).to_pyarrow_table()), ["k"])) == {
        "a": 3,
        "c": 2,
    }


def test_changes_of_a_folded_epoch_come_from_its_own_commit(tmp_path: Path) -> None:
    store = store_at(tmp_path)
    store.apply(1, [Change("upsert", {"k": "a", "v": 1})])
    store.apply(2, [Change("upsert", {"k": "a", "v": 2}), Change("delete", {"k": "z"})])
    store.apply(3, [Change("upsert", {"k": "b", "v": 3})])
    store.compact()  # folds 1..2
    assert store.changes_of(2).to_pylist() == [
        {"k": "a", "v": 2, "_op": "upsert"},
        {"k": "z", "v": None, "_op": "delete"},
    ]
    assert store_at(tmp_path).changes_of(1).to_pylist() == [{"k": "a", "v": 1, "_op": "upsert"}]
    with pytest.raises(InvalidInputError, match="epoch 4 is not recorded"):
        store.changes_of(4)


def test_a_table_in_the_older_layout_is_refused_by_name(tmp_path: Path) -> None:
    uri = str(tmp_path / "pipe" / "t")
    old = pa.table({"k": ["a"], "v": [1], "_row_hash": [7], "_epoch": [1]})
    write_deltalake(uri, old)
    with pytest.raises(InvalidInputError, match="no '_op' column") as info:
        store_at(tmp_path).apply(2, [Change("upsert", {"k": "b", "v": 2})])
    assert info.value.details["column"] == "_op"
    assert DeltaTable(uri).version() == 0


def checkpoints(store: ExpectedStateStore) -> list[int]:
    log = Path(store.uri) / "_delta_log"
    return sorted(int(p.name.split(".")[0]) for p in log.glob("*.checkpoint.parquet"))


def test_epochs_write_no_checkpoint_and_maintain_does_what_is_due(tmp_path: Path) -> None:
    # A commit that writes a checkpoint costs several times a plain one, so the
    # write path leaves them to maintain(), run between epochs.
    store = store_at(tmp_path)
    for e in range(1, 31):
        store.apply(e, [Change("upsert", {"k": f"k{e}", "v": e})])
    assert checkpoints(store) == []
    done = store.maintain(compact_changes_after=100)
    assert done == {"checkpoint": 30} and checkpoints(store) == [30]
    assert store.maintain() == {}  # nothing due: nothing written
    for e in range(31, 36):
        store.apply(e, [Change("upsert", {"k": f"k{e}", "v": e})])
    # Due once the files a merge would take (all but the newest epoch's) are as many.
    assert "compact_changes" not in store.maintain(checkpoint_every=1000, compact_changes_after=35)
    done = store.maintain(checkpoint_every=3, compact_changes_after=34)
    assert done["compact_changes"]["merged_files"] == 34  # all but the newest epoch
    assert done["checkpoint"] == DeltaTable(store.uri).version()
    names = sorted(Path(u).name for u in DeltaTable(store.uri).file_uris())
    assert [n.split("-")[1:3] for n in names] == [
        ["e000000000001", "e000000000034"],
        ["e000000000035", names[1].split("-")[2]],
    ]
    assert as_map(store.snapshot()) == {f"k{e}": e for e in range(1, 36)}
    assert as_map(store.snapshot(20)) == {f"k{e}": e for e in range(1, 21)}
