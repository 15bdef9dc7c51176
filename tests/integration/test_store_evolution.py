"""A store table that gained a column: every reader sees old rows with it NULL and rehashed.

Snapshots (whole, in parts, of an epoch before the change), compaction
(merged change files and a folded base), and a replay of the epoch that
added the column all agree with the row hash recomputed over the current
columns, and the Delta log holds the new column from the epoch that added it.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
import pytest
from deltalake import DeltaTable

from expected_state.evolving import SCHEMA_COMMITTED
from expected_state.store import ExpectedStateStore
from reconcile.core import hooks
from reconcile.core.contract import Change, FencedError
from reconcile.core.hashing import row_hash_arrow
from reconcile.core.schema_change import plan_schema_change

pytestmark = pytest.mark.integration

BEFORE = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("v", pa.int64())])
AFTER = BEFORE.append(pa.field("note", pa.string()))


def _hashes_hold(state: pa.Table, columns: list[str]) -> None:
    assert state.column("_row_hash").to_pylist() == row_hash_arrow(state, columns).to_pylist()


def _store(root: Path) -> ExpectedStateStore:
    return ExpectedStateStore(str(root), "shop", "orders", ["id"], generation=1)


def test_old_rows_read_null_and_rehashed_through_compaction(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.apply(0, [Change("upsert", {"id": i, "v": i}) for i in range(4)])
    store.apply(1, [Change("upsert", {"id": 9, "v": 9}), Change("delete", {"id": 3})])
    change = plan_schema_change(BEFORE, AFTER, ["id"], table=store.uri)
    assert change is not None
    store.evolve(change)
    store.apply(2, [Change("upsert", {"id": 1, "v": 10, "note": "new"})])
    store.evolve(change)  # a replay of epoch 2: the column is there, nothing is committed
    assert not store.apply(2, [Change("upsert", {"id": 1, "v": 10, "note": "new"})]).applied

    names = ["id", "v", "note"]
    fields = pa.schema(DeltaTable(store.uri).schema().to_arrow()).names
    assert "note" in fields
    state = store.snapshot().sort_by("id")
    assert state.column("id").to_pylist() == [0, 1, 2, 9]
    assert state.column("note").to_pylist() == [None, "new", None, None]
    _hashes_hold(state, names)
    old = store.snapshot(1).sort_by("id")  # time travel to before the column
    assert old.column("note").null_count == old.num_rows == 4
    _hashes_hold(old, names)
    parts = pa.concat_tables(p for _, p in store.snapshot_parts(None, state.column_names, parts=3))
    assert parts.sort_by("id").equals(state)

    store.compact_changes()
    assert store.snapshot().sort_by("id").equals(state)
    store.compact(through_epoch=2)
    folded = store.snapshot().sort_by("id")
    assert folded.equals(state)
    _hashes_hold(folded, names)
    # A reader that opens the table afresh takes the evolved schema from the log.
    again = _store(tmp_path)
    assert again.user_schema is not None and again.user_schema.names == names
    assert again.snapshot().sort_by("id").equals(state)


def test_a_zombie_store_writer_adds_no_column(tmp_path: Path) -> None:
    """The schema commit is fenced: a writer that lost the table adds nothing to it."""
    zombie = _store(tmp_path)
    zombie.apply(0, [Change("upsert", {"id": 1, "v": 1})])
    newer = ExpectedStateStore(str(tmp_path), "shop", "orders", ["id"], generation=2)
    newer.claim()
    version = DeltaTable(zombie.uri).version()
    change = plan_schema_change(BEFORE, AFTER, ["id"], table=zombie.uri)
    assert change is not None
    zombie.evolve(change)
    with pytest.raises(FencedError):
        zombie.apply(1, [Change("upsert", {"id": 2, "v": 2, "note": "zombie"})])
    table = DeltaTable(zombie.uri)
    assert table.version() == version
    assert "note" not in pa.schema(table.schema().to_arrow()).names


class _Crash(Exception):
    pass


def _crash() -> None:
    raise _Crash


def test_a_crash_between_the_schema_commit_and_the_epochs_commit_leaves_a_valid_table(
    tmp_path: Path,
) -> None:
    """The new column without the epoch reads NULL everywhere; the epoch's replay commits it."""
    store = _store(tmp_path)
    store.apply(0, [Change("upsert", {"id": 1, "v": 1})])
    change = plan_schema_change(BEFORE, AFTER, ["id"], table=store.uri)
    assert change is not None
    store.evolve(change)
    rows = [Change("upsert", {"id": 2, "v": 2, "note": "two"})]
    with hooks.at(SCHEMA_COMMITTED, _crash), pytest.raises(_Crash):
        store.apply(1, rows)
    restarted = _store(tmp_path)  # a new process: what the log holds, nothing more
    assert restarted.last_epoch() == 0
    state = restarted.snapshot()
    assert state.column("note").to_pylist() == [None]
    _hashes_hold(state, ["id", "v", "note"])
    # The replay plans against the evolved table: nothing to add; the rows go in.
    assert plan_schema_change(restarted.current_schema(), AFTER, ["id"], table="t") is None
    assert restarted.apply(1, rows).applied
    assert restarted.snapshot().sort_by("id").column("note").to_pylist() == [None, "two"]
