"""The scale benchmark's streaming part (``stream_sf1``): the demo pipeline, saturated.

TPC-H ``lineitem`` at ``--stream-scale`` (1: 6,001,215 lines) is cut by order
key into files of about ``--batch-rows`` lines each. The first file is the
warm-up (Spark up, the first batch compiled); once its rows are visible,
every other file is dropped at once, already written, so the stream runs
as fast as it goes (no trigger interval: the next micro-batch as soon as the
last is done, one file per micro-batch). Each mode is its own Spark driver
process with its own database on one PostgreSQL server (fsync on), writing
both sinks of the demo (the lines, and the running revenue per customer):

- ``at_least_once``: one transaction per batch, no guard against a replay;
- ``pull_and_diff``: the demo pipeline itself (``write_stream``, ``via="auto"``);
- ``pull_and_diff_via_executors``: the same, every batch staged by the executors;
- ``two_phase_30s``: checkpoint-bound two-phase commit, a checkpoint every 30 s.

The modes are those of the latency benchmark (``benchmarks.latency``), run
with the feed at saturation. Per run: rows/s (the warm-up file's rows left
out: from the drop of the others to the commit of the last of them in
PostgreSQL), Spark's batch duration p50/p99, and the peak memory of the
driver and of the executors (``latency_cpu``: the sum of PSS over each role's
processes, sampled every 0.2 s). Each run is checked against TPC-H itself:
a run with a line missing or counted twice fails the benchmark.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path
from typing import Any

from benchmarks.latency.bench import Bench
from benchmarks.latency.measure import Mode, modes
from benchmarks.latency.report import ratio
from reconcile.demo.embedded_pg import EmbeddedPostgres

__all__ = ["MODES", "stream_sf1"]

MODES = ("at_least_once", "pull_and_diff", "pull_and_diff_via_executors", "two_phase_30s")
CHECKPOINT_S = 30.0
KEPT = (
    "rows", "rows_per_s", "batches", "batch_ms_p50", "batch_ms_p99", "batch_ms_max",
    "peak_mb_driver", "peak_mb_executors", "p50_ms", "p99_ms", "cpu_s", "pg_cpu_s", "wall_s",
    "staged_via", "duplicates", "missing",
)  # fmt: skip


def stream_sf1(args: argparse.Namespace, base: Path) -> dict[str, Any]:
    """Every mode at every batch size, on one server; the figures and the two ratios."""
    server = EmbeddedPostgres(track_commit_timestamp="on", fsync="on",
                              max_prepared_transactions=400)  # fmt: skip
    chosen: list[Mode] = [m for m in modes([CHECKPOINT_S], extra=True) if m.name in MODES]
    settings = argparse.Namespace(scale=args.stream_scale, seed=7, master=args.stream_master,
                                  keep=False)  # fmt: skip
    out: dict[str, Any] = {"measured": True, "tpch_scale": args.stream_scale,
                           "master": args.stream_master, "checkpoint_s": CHECKPOINT_S}  # fmt: skip
    try:
        bench = Bench(settings, server, base / "stream")
        lines = bench.truth.lines
        out["lineitem_rows"] = lines
        by_size: dict[str, Any] = {}
        for batch_rows in args.batch_rows:
            files = max(2, round(lines / batch_rows))
            size: dict[str, Any] = {"files": files, "rows_per_file": lines // files}
            for mode in chosen:
                found = bench.run(mode, 0.0, files, crash=False, timeout=args.stream_timeout)
                if found["duplicates"] or found["missing"]:
                    raise RuntimeError(f"{mode.name} at {batch_rows:,} rows a batch lost or "
                                       f"duplicated lines: {found}")  # fmt: skip
                size[mode.name] = {k: found.get(k) for k in KEPT}
            alo = size["at_least_once"]["rows_per_s"]
            size["eo_vs_alo"] = ratio(size["pull_and_diff"]["rows_per_s"], alo)
            size["executors_vs_alo"] = ratio(size["pull_and_diff_via_executors"]["rows_per_s"],
                                              alo)  # fmt: skip
            by_size[str(batch_rows)] = size
        out["by_batch_rows"] = by_size
    finally:
        server.stop()
        shutil.rmtree(base / "stream", ignore_errors=True)
    return out


def ratios(stream: dict[str, Any]) -> tuple[float | None, float | None]:
    """The smallest pull-and-diff/at-least-once and executors/at-least-once over batch sizes."""
    if not stream.get("measured"):
        return None, None
    sizes = stream["by_batch_rows"].values()
    eo = [s["eo_vs_alo"] for s in sizes if s["eo_vs_alo"] is not None]
    ex = [s["executors_vs_alo"] for s in sizes if s["executors_vs_alo"] is not None]
    return (min(eo) if eo else None), (min(ex) if ex else None)
