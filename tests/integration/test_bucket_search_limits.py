"""How far a bucket search cuts: a level past the cap, and a key no index reads in range order.

Both searches stop cutting and pull the differing ranges as they are, and
still count exactly what full mode counts on the same snapshot of the table:

- a level that would compare more ranges than ``max_leaves`` is not cut;
- a first key column that leads no index (each deeper level would scan the
  whole table again) is searched on its first level only.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from expected_state.store import ExpectedStateStore
from reconcile.recovery.buckets import BucketLimits
from reconcile.recovery.engine import reconcile_table
from reconcile.recovery.modes import Mode
from reconcile.recovery.options import RecoverOptions
from reconcile.recovery.report import ReconcileReport
from sinks.postgres.sink import PostgresSink
from tests.recovery_setup import SIMPLE_SCHEMA, Setup, make_setup

pytestmark = pytest.mark.integration

ROWS = 10_000


def loaded(dsn: str, root: Path, ddl: str, keys: list[str]) -> Setup:
    setup = make_setup(dsn, str(root), "orders", SIMPLE_SCHEMA, ddl, keys)
    setup.write([{"id": i, "name": f"n{i % 97}", "total": i} for i in range(ROWS)])
    # Every 100th key of the first 15 % of the key space, by hand.
    assert setup.execute("UPDATE {t} SET total = -1 WHERE id % 100 = 0 AND id < 1500") == 15
    return setup


def verify(setup: Setup, mode: Mode, limits: BucketLimits | None = None) -> ReconcileReport:
    sink = PostgresSink(setup.dsn, "orders", name="orders", key=setup.keys)
    try:
        store = ExpectedStateStore(setup.root, setup.pipeline, "orders", setup.keys)
        target = sink.recovery_target(setup.pipeline, None, write=False)
        options = RecoverOptions(mode=mode, dry_run=True)
        return reconcile_table(target, store, options, bucket_options=limits)
    finally:
        sink.close()


def test_a_level_past_the_cap_pulls_its_ranges_as_they_are(pg_db: str, tmp_path: Path) -> None:
    ddl = "CREATE TABLE {} (id bigint PRIMARY KEY, name text, total bigint, _epoch bigint)"
    setup = loaded(pg_db, tmp_path, ddl, ["id"])
    # 32 ranges of ~312 rows; the ~5 that differ would be cut into 160 > 128.
    limits = BucketLimits(first_level=32, fanout=32, leaf_rows=16, max_leaves=128, full_share=1.0)
    capped = verify(setup, Mode.BUCKETS, limits)
    assert capped.mode == "buckets" and capped.changed == 15
    assert capped.buckets_compared == 32 and 0 < capped.buckets_differing <= 6
    # Whole first-level ranges pulled (each ~312 rows).
    assert capped.rows_pulled >= capped.buckets_differing * 300
    # Under the cap, the same search cuts the differing ranges and pulls less.
    deeper = verify(setup, Mode.BUCKETS, BucketLimits(first_level=32, leaf_rows=16))
    assert deeper.changed == 15 and deeper.buckets_compared > 32
    assert deeper.rows_pulled < capped.rows_pulled
    assert verify(setup, Mode.FULL).changed == 15


def test_without_a_range_index_only_the_first_level_is_compared(pg_db: str, tmp_path: Path) -> None:
    # The primary key leads with name, not with the first key column id.
    setup = loaded(pg_db, tmp_path,
                   "CREATE TABLE {} (id bigint, name text, total bigint, _epoch bigint, "
                   "PRIMARY KEY (name, id))", ["id", "name"])  # fmt: skip
    report = verify(setup, Mode.BUCKETS, BucketLimits(first_level=32, full_share=1.0))
    assert report.mode == "buckets" and report.changed == 15
    # Ranges of ~312 rows (more than leaf_rows) that differ, not cut again.
    assert report.buckets_compared == 32 and 0 < report.buckets_differing <= 6
    assert verify(setup, Mode.FULL).changed == 15
