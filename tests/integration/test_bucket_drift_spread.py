"""The default verify and repair on drift spread thin: exact counts, at a cost near full mode's.

A table and its expected state are loaded with the recovery benchmark's loader
(``benchmarks/recovery/bench.py``: the store through its own API, the sink through
the Postgres sink's COPY path). Then, as a user did by hand:

- 1 % of the rows changed, every 100th key (``id % 100 = 0``): every range of
  the first level differs, so buckets mode gives way to full mode. The default
  verify (auto) and repair must count the drift exactly and take at most a few
  times what full mode takes on the same table, measured in the same test;
- 57 % of the rows changed: auto falls back to full, and says so;
- 1 % of the keys of the first tenth of the table: buckets mode goes on, pulls
  only the ranges that differ (through the key's index), and counts exactly.

Times are compared with full mode's on the same table, never with a constant.
The 100k-row test runs by default; the million-row one is marked slow.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from benchmarks.recovery.bench import Sink
from reconcile import recover
from reconcile.recovery.report import ReconcileReport

pytestmark = pytest.mark.integration

# "A few times full mode's time": auto may first compare the first level's
# checksums (one scan) before it gives way to full mode, or pulls ranges.
FACTOR = 4.0


def timed(dsn: str, root: str, **options: Any) -> tuple[float, ReconcileReport]:
    started = time.perf_counter()
    report = recover(dsn, root, "bench", "big", **options)
    return time.perf_counter() - started, report


def count(dsn: str, where: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(f"SELECT count(*) FROM big WHERE {where}").fetchone()
    assert row is not None
    return int(row[0])


def drift(dsn: str, statement: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        changed = conn.execute(statement).rowcount
        conn.execute("VACUUM ANALYZE big")
    return changed


# The loader's rows: name = 'customer-' || (id % 100000). A row that differs
# from its expected state, read from the table itself.
WRONG = "name IS DISTINCT FROM 'customer-' || (id % 100000)::text"


def spread_drift_is_verified_and_repaired(dsn: str, root: str, n: int) -> None:
    Sink(dsn, root, "big", n)
    assert drift(dsn, "UPDATE big SET name = 'z' WHERE id % 100 = 0") == n // 100

    full_verify, report = timed(dsn, root, mode="full", dry_run=True)
    assert (report.missing, report.extra, report.changed) == (0, 0, n // 100)
    auto_verify, report = timed(dsn, root, dry_run=True)  # the default: auto
    assert (report.missing, report.extra, report.changed) == (0, 0, n // 100)
    assert report.mode == "full" and "gave way to full" in report.reason, report
    # The first level only (1,024 ranges), nearly every one differing.
    assert report.buckets_compared == 1024 and report.buckets_differing > 900
    assert auto_verify <= FACTOR * full_verify, (auto_verify, full_verify)

    auto_repair, report = timed(dsn, root)
    assert report.changed == n // 100 and report.applied == n // 100
    assert count(dsn, WRONG) == 0
    assert drift(dsn, "UPDATE big SET name = 'z' WHERE id % 100 = 0") == n // 100
    full_repair, report = timed(dsn, root, mode="full")
    assert report.applied == n // 100 and count(dsn, WRONG) == 0
    assert auto_repair <= FACTOR * full_repair, (auto_repair, full_repair)

    # 57 % of the rows: full mode costs less, and auto says why it ran.
    changed = drift(dsn, "UPDATE big SET name = 'y' WHERE id % 100 < 57")
    assert changed == n * 57 // 100
    _, report = timed(dsn, root, dry_run=True)
    assert report.mode == "full" and "gave way to full" in report.reason
    assert "100% of the rows" in report.reason or "99% of the rows" in report.reason
    assert (report.missing, report.extra, report.changed) == (0, 0, changed)
    assert report.rows_pulled == n

    # Drift in a tenth of the key space: buckets goes on and pulls little. The
    # repair of 57 % of the table needs the mass-change brake lifted.
    timed(dsn, root, mode="full", allow_mass_change=True)
    assert count(dsn, WRONG) == 0
    tenth = drift(dsn, f"UPDATE big SET name = 'w' WHERE id % 100 = 0 AND id < {n // 10}")
    local_verify, report = timed(dsn, root, dry_run=True)
    assert report.mode == "buckets", report
    assert (report.missing, report.extra, report.changed) == (0, 0, tenth)
    assert 0 < report.rows_pulled <= n // 5
    assert local_verify <= FACTOR * full_verify, (local_verify, full_verify)


def test_spread_drift_on_100k_rows_is_counted_exactly_near_full_modes_time(
    pg_db: str, tmp_path: Path
) -> None:
    spread_drift_is_verified_and_repaired(pg_db, str(tmp_path / "store"), 100_000)


@pytest.mark.slow
def test_spread_drift_on_a_million_rows_is_counted_exactly_near_full_modes_time(
    pg_db: str, tmp_path: Path
) -> None:
    spread_drift_is_verified_and_repaired(pg_db, str(tmp_path / "store"), 1_000_000)
