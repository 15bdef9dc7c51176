"""The latency benchmark's modes, runs and measurements: what PostgreSQL shows after a run.

A row's latency is from its file's drop (the file's modification time) to the
commit timestamp of the transaction that made it visible; duplicates and
missing rows are counted against TPC-H itself.
"""

from __future__ import annotations

import json
import random
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psycopg

from benchmarks.latency.restart import restart_steps
from reconcile.demo.tpch import summary
from reconcile.demo.tpch.data import Feed, Truth
from reconcile.demo.tpch.events import EventLog

__all__ = ["Mode", "Run", "measure", "modes"]


@dataclass(frozen=True)
class Mode:
    """One write mode: the name in the report, the process kind, the checkpoint interval."""

    name: str
    kind: str  # at_least_once | two_phase | pull_and_diff
    checkpoint_s: float = 0.0
    via: str = "auto"  # pull_and_diff: how the writer stages each micro-batch (write_stream's via=)

    def command(
        self, workdir: Path, epochs: int, trigger: float, master: str, rows: int
    ) -> list[str]:
        if self.kind == "pull_and_diff":
            return [sys.executable, "-m", "reconcile.demo.tpch.pipeline", str(workdir),
                    str(trigger), master, self.via]  # fmt: skip
        return [sys.executable, "-m", "benchmarks.latency.modes", self.kind, str(workdir),
                "--epochs", str(epochs), "--rows", str(rows), "--trigger", str(trigger),
                "--checkpoint-interval", str(self.checkpoint_s), "--master", master]  # fmt: skip

    def kills(self, seed: int) -> list[tuple[str, int]]:
        """Where the crash run kills the process, launch by launch (seeded)."""
        rng = random.Random(f"{seed}:{self.name}")
        if self.kind == "pull_and_diff":
            # The engine's two windows that a checkpoint-bound sink must hold results
            # back for: store recorded but no sink committed; one sink committed.
            return [("cycle.expected_state.recorded", 2), ("pg.commit.returned", 3)]
        if self.kind == "two_phase":
            # After a PREPARE (the batch durable, invisible, Spark's log not written),
            # then after a checkpoint's COMMIT PREPARED (before its deltas are folded).
            return [("bench.batch.written", rng.randint(3, 6)),
                    ("bench.checkpoint.committed", rng.randint(2, 4))]  # fmt: skip
        # Right after a batch's COMMIT, before Spark's commit log: it will run again.
        return [("bench.batch.written", rng.randint(3, 6)), ("bench.batch.written",
                rng.randint(3, 6))]  # fmt: skip


def modes(checkpoints: list[float], *, extra: bool = False) -> list[Mode]:
    """The modes of a run; ``extra`` adds the variants run only when named (``--modes``)."""
    found = [
        Mode("at_least_once", "at_least_once"),
        *(Mode(f"two_phase_{c:g}s", "two_phase", c) for c in checkpoints),
        Mode("pull_and_diff", "pull_and_diff"),
    ]
    if extra:  # the engine's other ways to stage a batch (write_stream's via=)
        found.append(Mode("pull_and_diff_via_executors", "pull_and_diff", via="executors"))
        found.append(Mode("pull_and_diff_via_driver", "pull_and_diff", via="driver"))
    return found


@dataclass
class Run:
    """One mode at one trigger interval: its folder, database, feed and launches."""

    mode: Mode
    trigger: float
    epochs: int
    workdir: Path
    dsn: str
    feed: Feed
    kills: list[tuple[str, int]] = field(default_factory=list)
    launches: list[tuple[int, float]] = field(default_factory=list)  # (pid, wall time) each
    crashes: list[str] = field(default_factory=list)
    failures: int = 0
    cpu_s: float = 0.0
    pg_cpu_s: float = 0.0
    machine_cpu_s: float = 0.0  # the whole machine's busy CPU over the run
    wall_s: float = 0.0
    peak_mb: dict[str, float] = field(default_factory=dict)  # role -> peak PSS (latency_cpu)
    feed_started: float = 0.0
    phase_seed: int = 0  # seeds where in its trigger interval each file lands


# -- what a run measured -----------------------------------------------------------


def _percentile(values: np.ndarray[Any, Any], q: float) -> float:
    return round(float(np.percentile(values, q)), 1) if len(values) else float("nan")


def row_latencies(conn: psycopg.Connection[Any], feed: Feed) -> tuple[list[int], list[float]]:
    """Per lineitem row: its file's index and its event-to-visible latency (s)."""
    found = summary.row_latencies(conn, feed)
    return [index for index, _ in found], [seconds for _, seconds in found]


def source_counts(conn: psycopg.Connection[Any], expected: Truth) -> dict[str, int]:
    """Both tables against the TPC-H files' own totals: duplicated and missing lines."""
    total, distinct = conn.execute(
        "SELECT count(*), count(DISTINCT (l_orderkey, l_linenumber)) FROM public.demo_lineitem"
    ).fetchone() or (0, 0)
    got = {
        cust: (revenue, n)
        for cust, revenue, n in conn.execute(
            "SELECT o_custkey, revenue, lines FROM public.demo_customer_revenue"
        )
    }
    over = under = wrong = 0
    for cust in expected.count.keys() | got.keys():
        revenue, n = got.get(cust, (None, 0))
        diff = n - expected.count.get(cust, 0)
        over += max(0, diff)
        under += max(0, -diff)
        wrong += (revenue, n) != (expected.revenue.get(cust), expected.count.get(cust))
    return {
        "lineitem_duplicates": total - distinct,
        "lineitem_missing": expected.lines - distinct,
        "lines_over_counted": over,
        "lines_under_counted": under,
        "customers_wrong": wrong,
        "duplicates": total - distinct + over,
        "missing": expected.lines - distinct + under,
    }


def batch_durations(workdir: Path) -> dict[str, Any]:
    """Spark's per-batch duration (ms) from the mode's progress files, warm-up batch left out."""
    batches: dict[int, dict[str, Any]] = {}
    for path in sorted((workdir / "progress").glob("*.json")):
        for p in json.loads(path.read_text()):
            batches[p["batch"]] = p
    whole = [p["trigger_ms"] for b, p in batches.items() if b > 0 and p["trigger_ms"] is not None]
    if not whole:
        return {}
    array = np.asarray(whole, dtype=float)
    found: dict[str, Any] = {
        "batch_ms_p50": _percentile(array, 50),
        "batch_ms_p95": _percentile(array, 95),
        "batch_ms_p99": _percentile(array, 99),
        "batch_ms_max": round(float(array.max()), 1),
        "batches": len(whole),
    }
    # The engine's own split of a batch (the demo pipeline's files have it).
    for part in ("add_batch_ms", "stage_ms", "commit_ms"):
        values = [p[part] for b, p in batches.items() if b > 0 and p.get(part) is not None]
        if values:
            found[f"{part}_p50"] = _percentile(np.asarray(values, dtype=float), 50)
    # How many sink-batches took each way (collect, executors, driver).
    ways = Counter(way for b, p in batches.items() if b > 0 for way in p.get("via", {}).values())
    if ways:
        found["staged_via"] = dict(sorted(ways.items()))
    return found


def restart_figures(run: Run) -> dict[str, Any]:
    """Each relaunch's steps (``benchmarks.latency.restart``), and its settled and resumed times."""
    steps = restart_steps(list(EventLog(run.workdir / "events.jsonl").read()), run.launches)
    return {
        "restart_steps": steps,
        "settled_s": [s["settled_s"] for s in steps],
        "resumed_s": [s["resumed_s"] for s in steps],
    }


def measure(run: Run, expected: Truth) -> tuple[dict[str, Any], list[float]]:
    """The run's figures, and its paced rows' latencies (ms) for the CDF."""
    with psycopg.connect(run.dsn, autocommit=True) as conn:
        files, latency = row_latencies(conn, run.feed)
        counts = source_counts(conn, expected)
        last_visible = conn.execute(
            "SELECT max(extract(epoch FROM pg_xact_commit_timestamp(xmin)))::float8 "
            "FROM public.demo_lineitem"
        ).fetchone()
    file_of = np.asarray(files)
    ms = np.asarray(latency) * 1000.0
    paced = ms[file_of > 0]  # the warm-up file's rows left out
    first_event = min(run.feed.path(s.index).stat().st_mtime for s in run.feed.slices[1:])
    span = (float(last_visible[0]) if last_visible and last_visible[0] else 0.0) - first_event
    rows = len(paced)
    # Growth over the run: a line through each file's median latency, from the
    # first paced file to the last. A writer that keeps up stays within about
    # one trigger interval (where in the interval a file lands); one that falls
    # behind adds its backlog file after file.
    medians = [(i, float(np.median(ms[file_of == i]))) for i in sorted(set(files)) if i > 0]
    growth = None
    if len(medians) > 2:
        xs, ys = zip(*medians, strict=True)
        slope = float(np.polyfit(xs, ys, 1)[0])
        growth = round(slope * (xs[-1] - xs[0]), 1)
    result: dict[str, Any] = {
        "mode": run.mode.name,
        "trigger_s": run.trigger,
        "checkpoint_s": run.mode.checkpoint_s or None,
        "epochs": run.epochs,
        "rows": rows,
        "p50_ms": _percentile(paced, 50),
        "p95_ms": _percentile(paced, 95),
        "p99_ms": _percentile(paced, 99),
        "max_ms": round(float(paced.max()), 1) if rows else None,
        "rows_per_s": round(rows / span, 1) if span > 0 else None,
        "latency_growth_ms": growth,
        "cpu_s": round(run.cpu_s, 1),
        "pg_cpu_s": round(run.pg_cpu_s, 1),
        # What other processes used meanwhile (the benchmark's parent, its feed and
        # polls, and the kernel included): the load this run shared the cores with.
        "others_cpu_s": round(max(0.0, run.machine_cpu_s - run.cpu_s - run.pg_cpu_s), 1),
        "wall_s": round(run.wall_s, 1),
        "peak_mb_driver": run.peak_mb.get("driver"),
        "peak_mb_executors": run.peak_mb.get("executors"),
        **batch_durations(run.workdir),
        **counts,
        "crashes": run.crashes,
        "failed_launches": run.failures,
        **restart_figures(run),
    }
    return result, sorted(paced.tolist())
