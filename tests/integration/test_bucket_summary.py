"""Bucket summaries: figures brought forward equal figures computed afresh, never trusted blindly.

The property tests need only the store (a real Delta table on disk): a summary
is built at one epoch from the expected rows, brought forward through random
epochs of inserts, updates and deletes (with compaction in between), and must
equal the figures computed from the expected rows at the newer epoch, range by
range. The Postgres tests run buckets mode end to end with a kept summary: its
counts equal full mode's, a wrong summary is caught and not used, and an epoch
recorded again drops the summary.
"""

from __future__ import annotations

import bisect
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from expected_state.store import ExpectedStateStore
from reconcile import recover
from reconcile.core.checksum import row_checksums
from reconcile.core.contract import Change
from reconcile.recovery.buckets import cut_bounds, sort_expected
from reconcile.recovery.summary import (
    FOLDER,
    BucketSummary,
    bring_forward,
    load_summary,
    rebalance,
    save_summary,
)
from tests.recovery_setup import SIMPLE_DDL, Setup, make_setup

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("total", pa.int64())])
COLUMNS = (("id", "int"), ("name", "text"), ("total", "int"))
# The checksum kinds the Postgres sink table of the end-to-end tests reflects.
COLUMNS_PG = (("id", "int"), ("name", "text"), ("total", "int"))


def figures_afresh(
    store: ExpectedStateStore, epoch: int, bounds: list[Any]
) -> list[tuple[int, int]]:
    """(rows, checksum) per range, from every expected row at ``epoch`` (no summary involved)."""
    rows = store.snapshot(epoch, columns=SCHEMA.names)
    sums = row_checksums(rows, COLUMNS)
    out = [[0, 0] for _ in range(len(bounds) + 1)]
    for key, checksum in zip(rows.column("id").to_pylist(), sums.tolist(), strict=True):
        b = bisect.bisect_right(bounds, key)
        out[b][0] += 1
        out[b][1] = (out[b][1] + checksum) % (1 << 64)
    return [(n, s) for n, s in out]


def summary_at(store: ExpectedStateStore, epoch: int, parts: int) -> BucketSummary:
    expected = sort_expected(store.snapshot(epoch, columns=SCHEMA.names), "id")
    column = expected.column("id").combine_chunks()
    bounds, _ = cut_bounds(column, 0, expected.num_rows, parts)
    figures = figures_afresh(store, epoch, bounds)
    return BucketSummary(
        epoch=epoch,
        version=store.version_of(epoch),
        first_key="id",
        columns=COLUMNS,
        bounds=bounds,
        rows=np.array([n for n, _ in figures], dtype=np.int64),
        sums=np.array([s for _, s in figures], dtype=np.uint64),
    )


def changes(keys: list[int], deletes: set[int], seed: int) -> list[Change]:
    out = []
    for k in keys:
        if k in deletes:
            out.append(Change("delete", {"id": k}))
        else:
            out.append(Change("upsert", {"id": k, "name": f"n{k}-{seed}", "total": k * seed}))
    return out


def upserts(keys: range, seed: int) -> pa.Table:
    """An epoch of upserts as Arrow (what a large epoch looks like)."""
    ids = list(keys)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "name": pa.array([f"n{k}-{seed}" for k in ids]),
            "total": pa.array([k * seed for k in ids], pa.int64()),
            "_op": pa.array(["upsert"] * len(ids)),
        }
    )


epochs_strategy = st.lists(
    st.tuples(
        st.lists(st.integers(0, 400), min_size=1, max_size=40, unique=True),  # keys touched
        st.sets(st.integers(0, 400), max_size=10),  # of which deleted
        st.booleans(),  # compact the change files after this epoch
    ),
    min_size=1,
    max_size=5,
)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(epochs=epochs_strategy, parts=st.integers(1, 12))
def test_a_summary_brought_forward_equals_the_figures_computed_afresh(
    tmp_path_factory: pytest.TempPathFactory, epochs: list[Any], parts: int
) -> None:
    root = str(tmp_path_factory.mktemp("store"))
    store = ExpectedStateStore(root, "p", "t", ["id"], schema=SCHEMA)
    store.apply(0, changes(list(range(0, 300, 2)), set(), 1))
    summary = summary_at(store, 0, parts)
    for epoch, (keys, deleted, compact) in enumerate(epochs, start=1):
        store.apply(epoch, changes(keys, deleted, epoch + 1))
        if compact:
            store.compact_changes()
    last = len(epochs)
    forward = bring_forward(summary, store, last)
    assert forward is not None
    assert forward.epoch == last and forward.version == store.version_of(last)
    assert forward.figures == figures_afresh(store, last, summary.bounds)
    # From any epoch in between, too.
    middle = bring_forward(summary, store, last // 2 + 1)
    assert middle is not None
    assert middle.figures == figures_afresh(store, last // 2 + 1, summary.bounds)


def test_a_summary_of_an_epoch_recorded_again_is_dropped(tmp_path: Path) -> None:
    store = ExpectedStateStore(str(tmp_path), "p", "t", ["id"], schema=SCHEMA)
    store.apply(0, changes(list(range(50)), set(), 1))
    store.apply(1, changes([3, 4], set(), 2))
    summary = summary_at(store, 1, 4)
    assert store.revert(1)
    store.apply(1, changes([3, 4, 5], {5}, 3))
    assert bring_forward(summary, store, 1) is None
    # An older epoch than the summary's cannot be reached by going forward.
    assert bring_forward(summary_at(store, 1, 4), store, 0) is None


def test_a_lopsided_range_is_cut_again_from_its_own_rows(tmp_path: Path) -> None:
    store = ExpectedStateStore(str(tmp_path), "p", "t", ["id"], schema=SCHEMA)
    store.apply(0, upserts(range(100_000), 1))
    summary = summary_at(store, 0, 1000)
    # Ascending keys: every new row lands in the last range.
    store.apply(1, upserts(range(100_000, 103_000), 2))
    forward = bring_forward(summary, store, 1)
    assert forward is not None and int(forward.rows[-1]) == 3000 + 100

    def read(spans: list[tuple[Any, Any]]) -> pa.Table:
        table: pa.Table = store.snapshot(1, columns=SCHEMA.names, ranges=spans)
        return table

    cut = rebalance(forward, read)
    assert cut is not None and len(cut.bounds) > len(summary.bounds)
    assert int(cut.rows.max()) <= 2 * (int(cut.rows.sum()) // len(cut.rows)) + 1
    assert cut.figures == figures_afresh(store, 1, cut.bounds)
    # Figures that do not add up are not cut from: the summary is refused.
    wrong = BucketSummary(**{**forward.__dict__, "sums": forward.sums + np.uint64(1)})
    assert rebalance(wrong, read) is None


def test_a_kept_summary_survives_a_reopen_and_is_keyed_by_its_columns(tmp_path: Path) -> None:
    store = ExpectedStateStore(str(tmp_path), "p", "t", ["id"], schema=SCHEMA)
    store.apply(0, changes(list(range(40)), set(), 1))
    summary = summary_at(store, 0, 4)
    save_summary(store, summary)
    assert (tmp_path / "p" / "t" / FOLDER).is_dir()
    again = load_summary(ExpectedStateStore(str(tmp_path), "p", "t", ["id"]), COLUMNS, "id")
    assert again is not None and again.figures == summary.figures
    assert again.bounds == summary.bounds and again.version == summary.version
    # Other sink types checksum other texts: another summary, not this one.
    assert (
        load_summary(store, (("id", "int"), ("name", "text"), ("total", "numeric")), "id") is None
    )


# -- end to end on PostgreSQL ---------------------------------------------------------


def _drift(simple: Setup) -> None:
    simple.execute("DELETE FROM {t} WHERE id IN (3, 4)")
    simple.execute("UPDATE {t} SET name = 'hand' WHERE id = 5")
    simple.execute("UPDATE {t} SET total = NULL WHERE id = 6")
    simple.execute("INSERT INTO {t} (id, name, total) VALUES (5000, 'new', 1)")


def _counts(report: Any) -> tuple[int, int, int]:
    return (report.missing, report.extra, report.changed)


def test_buckets_mode_with_a_kept_summary_counts_what_full_mode_counts(simple: Setup) -> None:
    first = recover(simple.dsn, simple.root, "shop", "orders", mode="buckets", dry_run=True)
    assert not first.drift
    kept = list((Path(simple.root) / "shop" / "orders" / FOLDER).glob("summary-*.parquet"))
    assert len(kept) == 1
    # The store moves on (an epoch the sink lacks), the sink drifts by hand.
    store = ExpectedStateStore(simple.root, "shop", "orders", ["id"])
    last = store.last_epoch()
    assert last is not None
    store.apply(last + 1, changes([7, 8, 9000], {8}, 5))
    _drift(simple)
    full = recover(simple.dsn, simple.root, "shop", "orders", mode="full", dry_run=True)
    buckets = recover(simple.dsn, simple.root, "shop", "orders", mode="buckets", dry_run=True)
    assert _counts(buckets) == _counts(full) == (3, 2, 3)
    # The summary was brought forward to the new epoch and kept.
    summary = load_summary(store, COLUMNS_PG, "id")
    assert summary is not None and summary.epoch == last + 1
    repaired = recover(simple.dsn, simple.root, "shop", "orders", mode="buckets")
    assert repaired.applied == 8
    assert not recover(simple.dsn, simple.root, "shop", "orders", mode="full", dry_run=True).drift


def test_a_wrong_summary_is_caught_replaced_and_the_drift_still_found(simple: Setup) -> None:
    recover(simple.dsn, simple.root, "shop", "orders", mode="buckets", dry_run=True)
    store = ExpectedStateStore(simple.root, "shop", "orders", ["id"])
    truth = load_summary(store, COLUMNS_PG, "id")
    assert truth is not None and len(truth.rows) > 2
    # A kept summary that no longer describes the store in range 1 (as a bug or
    # a stray write would leave it), while the sink drifts in range 0.
    sums = truth.sums.copy()
    sums[1] += np.uint64(7)
    save_summary(store, BucketSummary(**{**truth.__dict__, "sums": sums}))
    simple.execute("UPDATE {t} SET name = 'hand' WHERE id = 0")
    report = recover(simple.dsn, simple.root, "shop", "orders", mode="buckets", dry_run=True)
    assert _counts(report) == (0, 0, 1)
    # Range 1's expected rows did not add up to the kept figures: the summary
    # was dropped and computed again from the expected rows.
    fresh = load_summary(store, COLUMNS_PG, "id")
    assert fresh is not None and fresh.figures == truth.figures


@pytest.fixture
def simple(pg_db: str, tmp_path: Path) -> Setup:
    setup = make_setup(pg_db, str(tmp_path), "orders", SCHEMA, SIMPLE_DDL, ["id"])
    for e in range(3):
        setup.write(
            [{"id": i, "name": f"n{i}", "total": 10 * i + e} for i in range(e * 40, e * 40 + 60)]
        )
    return setup


def test_auto_says_whether_its_bucket_check_computes_the_summary_or_reads_a_kept_one(
    simple: Setup,
) -> None:
    first = recover(simple.dsn, simple.root, "shop", "orders", dry_run=True)
    assert first.mode == "buckets" and "no bucket summary is kept yet" in first.reason
    assert list((Path(simple.root) / "shop" / "orders" / FOLDER).glob("summary-*.parquet"))
    again = recover(simple.dsn, simple.root, "shop", "orders", dry_run=True)
    assert again.mode == "buckets" and "a kept summary stands for the expected" in again.reason


def test_a_snapshot_of_key_ranges_holds_the_rows_of_those_ranges_only(tmp_path: Path) -> None:
    # Read directly, not through a caller that might filter again: buckets mode reads the
    # differing ranges only, and a read of every row would cost the whole table's memory.
    store = ExpectedStateStore(str(tmp_path), "p", "t", ["id"], schema=SCHEMA)
    store.apply(0, upserts(range(100), 1))
    store.apply(1, changes([5, 15, 60], {15}, 2))  # a change file over the base, a delete
    spans: list[tuple[Any, Any]] = [(None, 3), (10, 20), (50, None)]
    table = store.snapshot(1, columns=SCHEMA.names, ranges=spans)
    want = [*range(3), *(k for k in range(10, 20) if k != 15), *range(50, 100)]
    assert sorted(table.column("id").to_pylist()) == want
    ids, totals = table.column("id").to_pylist(), table.column("total").to_pylist()
    assert dict(zip(ids, totals, strict=True))[60] == 120  # the change file's, not the base's
