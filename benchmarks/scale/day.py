"""The scale benchmark's day of epochs (``store_day``): a store written once a second for a day.

``--epochs`` epochs of 100 rows (half updates, half new keys) into one store
table, with ``maintain()`` after each as a pipeline runs it: commit latency
over the first and last epochs, RSS over the run and its trend, the time to
open the store at the end, the disk used (split as ``reconcile status`` splits
it), and the rows the merges wrote per row the epochs wrote.
"""

from __future__ import annotations

import os
import resource
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.expected_state import batch, summary
from expected_state.disk_use import DiskUse, pipeline_disk_use
from expected_state.store import ExpectedStateStore

__all__ = ["DAY_MARGIN_EPOCHS", "bench_store_day"]


def _rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _disk_mb(path: Path) -> float:
    return round(sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 1e6, 1)


# The day is one epoch a second; vacuum's safety margin (ten minutes) is in wall time,
# so a day run in minutes would keep every rewritten file for thousands of its epochs.
# The margin is scaled to the run's pace: it covers this many epochs, as on a real day.
DAY_MARGIN_EPOCHS = 600


def _trend_mb_per_10k(rss: list[tuple[int, float]], after: int) -> float | None:
    """The least-squares slope of RSS over the epochs past ``after``, in MB per 10,000."""
    points = [(e, mb) for e, mb in rss if e > after]
    if len(points) < 3:
        return None
    x = np.array([e for e, _ in points], dtype=float)
    y = np.array([mb for _, mb in points], dtype=float)
    return round(float(np.polyfit(x, y, 1)[0]) * 10_000, 2)


def bench_store_day(root: Path, epochs: int, window: int) -> dict[str, Any]:
    """``epochs`` epochs of 100 rows (half updates) with ``maintain()`` after each."""
    store = ExpectedStateStore(str(root), "bench", "t", ["k"])
    store.apply(0, batch(np.arange(100_000), seed=0))
    rng = np.random.default_rng(3)
    latencies: list[float] = []
    rss: list[tuple[int, float]] = [(0, round(_rss_mb(), 1))]
    load_before = round(os.getloadavg()[0], 2)
    next_key = 100_000
    merges = merged_rows = 0  # the rows the merges wrote: their write amplification
    started = time.perf_counter()
    for e in range(1, epochs + 1):
        old = rng.choice(next_key, 50, replace=False)
        new = np.arange(next_key, next_key + 50)
        next_key += 50
        data = batch(np.concatenate([old, new]), seed=e)
        t0 = time.perf_counter()
        store.apply(e, data)
        pace_s = (t0 - started) / max(1, e - 1) if e > 1 else 0.0
        done = store.maintain(
            keep_from_epoch=e - 1, safety_margin_minutes=DAY_MARGIN_EPOCHS * pace_s / 60
        )
        if "compact_changes" in done:
            merges += 1
            merged_rows += done["compact_changes"]["rows"]
        latencies.append((time.perf_counter() - t0) * 1000)
        if e % max(1, epochs // 200) == 0 or e == epochs:
            rss.append((e, round(_rss_mb(), 1)))
        if e % max(1, epochs // 20) == 0:
            print(f"  store day: epoch {e:,} of {epochs:,}", flush=True)
    total_s = time.perf_counter() - started
    t0 = time.perf_counter()
    opened = ExpectedStateStore(str(root), "bench", "t", ["k"])
    last = opened.last_epoch()
    open_s = time.perf_counter() - t0
    first, final = summary(latencies[:window]), summary(latencies[-window:])
    return {
        "epochs": epochs,
        "rows_per_epoch": 100,
        "window": min(window, epochs),
        "commit_first": first,
        "commit_last": final,
        "last_p95_vs_first": (
            round(final["p95_ms"] / first["p95_ms"], 3) if first["p95_ms"] else None
        ),
        "rss_start_mb": rss[0][1],
        "rss_end_mb": rss[-1][1],
        "rss_growth": round(rss[-1][1] / rss[0][1] - 1, 3),
        "rss_over_time": rss,
        "latency_ms_every": latencies[:: max(1, epochs // 2000)],
        "open_s": round(open_s, 3),
        "last_epoch_read": last,
        "rss_trend_mb_per_10k": _trend_mb_per_10k(rss, after=min(10_000, epochs // 8)),
        "disk_mb": _disk_mb(root),
        "disk_split_mb": {
            name: round(count / 1e6, 1)
            for name, count in sum(pipeline_disk_use(str(root), "bench").values(), DiskUse())
            .as_dict()
            .items()
            if name != "files"
        },
        "margin_epochs": DAY_MARGIN_EPOCHS,
        "merges": merges,
        "merge_rows_written": merged_rows,
        # Rows the merges wrote per row the epochs wrote.
        "write_amplification": round(merged_rows / (epochs * 100), 2),
        "load_average": [load_before, round(os.getloadavg()[0], 2)],
        "seconds": round(total_s, 1),
    }
