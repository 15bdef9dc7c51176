"""A Delta sink under the engine's other pull-and-diff users: a rebuild, and a key written twice.

A rebuild converges a ``delta://`` table to the new logic's state by diff, in
Delta commits read back from the table itself, and verify is clean after it.
The delta-rs sink appends: a key written in two epochs is two rows, which
verify counts as drift (docs/sinks.md says so), never as silence, and a
repair leaves the newest copy once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from reconcile import CommitCycle, recover
from reconcile.engine.expected import ExpectedState
from reconcile.rebuild import rebuild
from sinks.delta.sink import DeltaSink
from tests.integration.rebuild_pipeline import LOGICS, PIPELINE, outputs, recompute, state

pytestmark = pytest.mark.integration

SCHEMA = pa.schema([("id", pa.int64()), ("total", pa.int64()), ("tag", pa.string())])


def _events() -> list[list[tuple[int, int]]]:
    """Three epochs of 40 events each, every id written once (an event table)."""
    return [[(i, i + e) for i in range(e * 40, e * 40 + 40)] for e in range(3)]


def _builder(root: Path, logic: str | None) -> Any:
    def make() -> CommitCycle:
        expected = ExpectedState(str(root / "store"), PIPELINE, {"orders": ["id"]})
        sink = DeltaSink("orders", root / "lake", schema=SCHEMA)
        return CommitCycle(PIPELINE, [sink], expected_state=expected, logic_version=logic)

    return make


def _run(root: Path, logic: str, epochs: list[list[tuple[int, int]]]) -> None:
    cycle = _builder(root, logic)()
    try:
        cycle.start()
        for n, events in enumerate(epochs):
            cycle.run_epoch(n, {"orders": outputs(LOGICS[logic], events)})
    finally:
        cycle.close()


def _table(root: Path) -> dict[int, tuple[Any, ...]]:
    rows = DeltaTable(str(root / "lake" / "orders")).to_pyarrow_table().to_pylist()
    assert len({r["id"] for r in rows}) == len(rows), "a key is in the table twice"
    return {r["id"]: (r["total"], r["tag"]) for r in rows}


def test_a_rebuild_converges_a_delta_table_to_the_new_logic(tmp_path: Path) -> None:
    epochs = _events()
    _run(tmp_path, "v1", epochs)
    old, new = state(LOGICS["v1"], epochs), state(LOGICS["v2"], epochs)
    assert _table(tmp_path) == old and old != new
    dsn = f"delta://{tmp_path / 'lake'}?key=id"
    before = DeltaTable(str(tmp_path / "lake" / "orders")).version()
    report = rebuild(_builder(tmp_path, "v1"), lambda _: recompute(LOGICS["v2"], epochs),
                     logic_version="v2", part_rows=1000)  # fmt: skip
    table = report.tables["orders"]
    assert table.plan is not None and table.applied == table.plan.changed > 2
    # The table itself, read by deltalake: the new logic's state, each key once.
    assert _table(tmp_path) == new
    assert DeltaTable(str(tmp_path / "lake" / "orders")).version() > before
    found = recover(dsn, str(tmp_path / "store"), PIPELINE, "orders", mode="full", dry_run=True)
    assert (found.missing, found.extra, found.changed) == (0, 0, 0), found


def test_a_key_the_appending_sink_wrote_twice_is_counted_as_extra(tmp_path: Path) -> None:
    epochs = [[(1, 1), (2, 2)], [(1, 5), (3, 3)]]  # id 1 in both epochs
    _run(tmp_path, "v1", epochs)
    rows = DeltaTable(str(tmp_path / "lake" / "orders")).to_pyarrow_table().to_pylist()
    assert sorted(r["id"] for r in rows) == [1, 1, 2, 3]
    dsn = f"delta://{tmp_path / 'lake'}?key=id"
    store = str(tmp_path / "store")
    found = recover(dsn, store, PIPELINE, "orders", mode="full", dry_run=True)
    # One copy too many; the copy the diff pairs with the key may be the older one.
    assert found.missing == 0 and found.extra == 1 and found.changed <= 1, found
    recover(dsn, store, PIPELINE, "orders", mode="full", allow_mass_change=True)  # 2 of 4 rows
    assert _table(tmp_path) == state(LOGICS["v1"], epochs)  # the newest copy, once
