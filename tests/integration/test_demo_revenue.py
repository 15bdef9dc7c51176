"""The demo's running revenue totals: kept between batches, always the store's state of an epoch."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pytest

from expected_state.store import ExpectedStateStore
from reconcile.demo.tpch.revenue import REVENUE_ARROW, ROLL_MAX_EPOCHS, RunningTotals

pytestmark = [pytest.mark.integration]


def _epoch(rows: list[tuple[int, str, int]], deletes: tuple[int, ...] = ()) -> pa.Table:
    """An epoch's changes: (customer, revenue, lines) upserts, and deleted customers."""
    keys = [r[0] for r in rows] + list(deletes)
    revenue_type = REVENUE_ARROW.field("revenue").type
    return pa.table(
        {
            "o_custkey": pa.array(keys, pa.int64()),
            "revenue": pa.array(
                [Decimal(r[1]) for r in rows] + [None] * len(deletes), revenue_type
            ),
            "lines": pa.array([r[2] for r in rows] + [None] * len(deletes), pa.int64()),
            "_op": ["upsert"] * len(rows) + ["delete"] * len(deletes),
        }
    )


def _state(table: pa.Table) -> dict[int, tuple[Decimal, int]]:
    rows = table.to_pylist()
    assert len({r["o_custkey"] for r in rows}) == len(rows), "a customer held twice"
    return {r["o_custkey"]: (r["revenue"], r["lines"]) for r in rows}


@pytest.fixture
def store(tmp_path: Path) -> ExpectedStateStore:
    store = ExpectedStateStore(str(tmp_path / "state"), "demo", "demo_customer_revenue",
                               ["o_custkey"], schema=REVENUE_ARROW)  # fmt: skip
    epochs = [
        _epoch([(1, "10.5000", 1), (2, "20.0000", 2)]),
        _epoch([(2, "25.0000", 3), (3, "1.0000", 1)]),  # 2 changed, 3 new
        _epoch([(4, "4.0000", 1)], deletes=(1,)),  # 1 removed
        _epoch([]),  # an epoch with no rows for this table
        _epoch([(1, "7.0000", 1), (3, "2.5000", 2)]),  # 1 back, 3 changed
    ]
    for e, changes in enumerate(epochs):
        store.apply(e, changes)
    return store


def test_rolled_forward_epoch_by_epoch_the_totals_are_the_stores_state_of_each(
    store: ExpectedStateStore,
) -> None:
    totals = RunningTotals(store)
    for e in range(5):
        assert _state(totals.as_of(e)) == _state(store.snapshot(epoch=e)), f"epoch {e}"
    assert (totals.read_whole, totals.rolled) == (1, 4)  # read once, then one epoch's file each


def test_a_batch_run_again_or_an_epoch_far_ahead_reads_the_totals_whole(
    store: ExpectedStateStore,
) -> None:
    totals = RunningTotals(store)
    assert _state(totals.as_of(1)) == _state(store.snapshot(epoch=1))
    assert _state(totals.as_of(1)) == _state(store.snapshot(epoch=1))  # held: nothing read
    assert totals.read_whole == 1
    assert _state(totals.as_of(3)) == _state(store.snapshot(epoch=3))  # two epochs rolled
    assert (totals.read_whole, totals.rolled) == (1, 2)
    # Back to an earlier epoch (the batch after it run again): never rolled backwards.
    assert _state(totals.as_of(2)) == _state(store.snapshot(epoch=2))
    assert totals.read_whole == 2


def test_more_epochs_behind_than_the_roll_bound_are_read_whole(tmp_path: Path) -> None:
    store = ExpectedStateStore(str(tmp_path / "state"), "demo", "demo_customer_revenue",
                               ["o_custkey"], schema=REVENUE_ARROW)  # fmt: skip
    for e in range(ROLL_MAX_EPOCHS + 2):
        store.apply(e, _epoch([(e % 3, f"{e}.0000", e)]))
    totals = RunningTotals(store)
    totals.as_of(0)
    last = ROLL_MAX_EPOCHS + 1
    assert _state(totals.as_of(last)) == _state(store.snapshot(epoch=last))
    assert (totals.read_whole, totals.rolled) == (2, 0)
    assert _state(totals.as_of(last)) == {0: (Decimal("15.0000"), 15), 1: (Decimal("16.0000"), 16),
                                          2: (Decimal("17.0000"), 17)}  # fmt: skip
