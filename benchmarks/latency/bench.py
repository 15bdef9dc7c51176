"""Benchmark: event-to-visible latency of one streaming workload under three write modes.

``python -m benchmarks.latency [--scale 0.01] [--epochs 60] [--crash-epochs 30]``

The workload is the TPC-H demo's (``reconcile.demo.tpch``): lineitem cut into
``--epochs`` files by order key, dropped one at a time into a watched folder,
and streamed by Spark Structured Streaming (one file per micro-batch,
``maxFilesPerTrigger=1``) into ``demo_lineitem`` (the lines, upserted) and
``demo_customer_revenue`` (per customer, the running revenue and line count)
in PostgreSQL. Only how a micro-batch is written differs:

- ``at_least_once``: one transaction per batch, totals added; no guard against
  a replayed batch (``benchmarks.latency.modes``);
- ``two_phase_{C}s``: checkpoint-bound two-phase commit, a batch PREPAREd and
  made visible by the next checkpoint, every C seconds (the same module);
- ``pull_and_diff``: the engine, the demo's own pipeline process unchanged
  (``reconcile.demo.tpch.pipeline``: expected state, markers, one transaction
  per sink; pull-and-diff recovery after a restart).

Each mode runs as its own Spark driver process against its own fresh database
on one throwaway PostgreSQL 15 server (fsync on, ``track_commit_timestamp``
on). The parent drops the files one per trigger interval, each at a seeded
random point of its interval, the same points for every mode
(``benchmarks.latency.feed``: why).

Latency of a lineitem row: its file's modification time (the drop, a rename
into the folder) to the commit timestamp of the transaction that made the row
visible (``pg_xact_commit_timestamp(xmin)``; for two-phase, the COMMIT
PREPARED). Warm-up: file 0 is dropped alone; the paced feed of the others
starts once its rows are visible, and its rows are left out of the figures.

Trigger intervals: the shortest one the at-least-once pipeline sustains here
(tried from ``--candidates`` upward: Spark's batch duration p95 below the
interval, and per-file latency not growing over the run), and 1 s.

Crash runs (at 1 s, ``--crash-epochs`` files): each mode's process is killed
with SIGKILL at two seeded points (a point the run does not reach does not
fire; the report counts the kills that did) and restarted on the same Spark
checkpoint; then both tables are checked against TPC-H itself: duplicates
(duplicated lines, plus lines over-counted in the totals) and missing (lines
absent, plus lines under-counted).

Writes ``latency.json``, ``latency.md`` and ``latency_cdf.png`` into ``--out``.
The JSON keeps each clean run's latency CDF as quantiles (``cdf_quantiles_ms``),
so ``--plot-only`` redraws the plot from it. ``--quick`` (which ``python -m
benchmarks --quick`` passes) marks the report and the plot as a quick run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.latency.measure import Mode, Run, measure, modes  # noqa: E402
from benchmarks.latency.report import (  # noqa: E402
    HEADLINE_TRIGGER,
    cdf_quantiles,
    judge_headline,
    markdown,
    plot,
    sustainable,
    targets,
)
from benchmarks.latency.run import execute  # noqa: E402
from benchmarks.report import RESULTS, machine, now, versions, write_report  # noqa: E402
from reconcile.demo.embedded_pg import EmbeddedPostgres  # noqa: E402
from reconcile.demo.tpch.data import SINK_TABLES_SQL, Feed, generate, truth  # noqa: E402

__all__ = ["MODES", "main"]

MODES = ("at_least_once", "two_phase_1s", "two_phase_5s", "two_phase_30s", "pull_and_diff")


# -- the benchmark -------------------------------------------------------------------


class Bench:
    """The shared state of a benchmark run: TPC-H, its truth, the server, the folders."""

    def __init__(self, args: argparse.Namespace, server: EmbeddedPostgres, base: Path) -> None:
        self.args, self.server, self.base = args, server, base
        self.tpch = generate(base / "tpch", args.scale)
        self.truth = truth(self.tpch)
        self.postmaster = server.postmaster_pid()
        self.runs = 0
        self.cdf: dict[str, dict[str, list[float]]] = {}

    def run(
        self, mode: Mode, trigger: float, epochs: int, *, crash: bool, timeout: float = 0.0
    ) -> dict[str, Any]:
        self.runs += 1
        workdir = self.base / f"run-{self.runs:02d}-{mode.name}-{trigger:g}s"
        workdir.mkdir()
        (workdir / "tpch").symlink_to(self.tpch)
        db = self.server.create_database("latency")
        dsn = self.server.dsn(db)
        with psycopg.connect(dsn, autocommit=True) as conn:
            for statement in SINK_TABLES_SQL:
                conn.execute(statement.encode())
        feed = Feed(self.tpch, workdir / "inbox", epochs)
        run = Run(mode, trigger, epochs, workdir, dsn, feed,
                  kills=mode.kills(self.args.seed) if crash else [],
                  phase_seed=self.args.seed)  # fmt: skip
        what = f"{mode.name} at {trigger:g}s" + (" with kills" if crash else "")
        print(f"{what}: {epochs} files ...", flush=True)
        if trigger == 0:  # as fast as it goes: every file at once, ready to rename in
            feed.write_ahead([part.index for part in feed.slices])
        execute(run, self.args.master, self.postmaster,
                timeout=timeout or 300 + epochs * trigger * 3)  # fmt: skip
        result, paced = measure(run, self.truth)
        if not crash:
            self.cdf.setdefault(f"{trigger:g}", {})[mode.name] = paced
        print(f"  {json.dumps({k: result[k] for k in SHOWN if k in result})}", flush=True)
        if not self.args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
            self.server.drop_database(db)
        return result


SHOWN = ("p50_ms", "p95_ms", "p99_ms", "rows_per_s", "latency_growth_ms", "batch_ms_p95",
         "cpu_s", "duplicates", "missing", "crashes", "settled_s", "resumed_s")  # fmt: skip


def calibrate(bench: Bench, candidates: list[float]) -> tuple[float, list[dict[str, Any]], Any]:
    """The shortest interval the at-least-once pipeline sustains (its run kept as its result)."""
    tried: list[dict[str, Any]] = []
    for interval in sorted(candidates):
        result = bench.run(modes([])[0], interval, bench.args.epochs, crash=False)
        ok, why = sustainable(result, interval)
        tried.append({"interval_s": interval, "sustained": ok, "why": why,
                      "batch_ms_p95": result.get("batch_ms_p95"),
                      "latency_growth_ms": result.get("latency_growth_ms"),
                      "p99_ms": result["p99_ms"]})  # fmt: skip
        print(f"  {interval:g}s: {'sustained' if ok else 'not sustained'} ({why})", flush=True)
        if ok:
            return interval, tried, result
    return HEADLINE_TRIGGER, tried, None


def run_all(args: argparse.Namespace) -> dict[str, Any]:
    base = Path(tempfile.mkdtemp(prefix="reconcile-bench-latency-", dir=args.workdir))
    server = EmbeddedPostgres(
        track_commit_timestamp="on", fsync="on",
        max_prepared_transactions=max(100, 2 * max(args.epochs, args.crash_epochs)),
    )  # fmt: skip
    report: dict[str, Any] = {
        "machine": machine(
            python=platform.python_version(),
            spark_master=args.master,
            load_average_at_start=[round(x, 2) for x in os.getloadavg()],
        ),
        "versions": versions("pyspark", "pyarrow", "psycopg", "deltalake"),
        "when": now(),
        "scale": args.scale,
        "epochs": args.epochs,
        "crash_epochs": args.crash_epochs if args.crash else None,
        "seed": args.seed,
    }
    try:
        with server.connect() as conn:
            report["postgres"] = str(conn.execute("SHOW server_version").fetchone()[0])  # type: ignore[index]
        bench = Bench(args, server, base)
        report["lineitem_rows"] = bench.truth.lines
        all_modes = [m for m in modes(args.checkpoints, extra=True) if m.name in args.modes]
        triggers: list[float] = []
        by_trigger: dict[str, dict[str, Any]] = {}
        if args.triggers:
            triggers = sorted(set(args.triggers))
            report["calibration"] = {"given": triggers}
        else:
            shortest, tried, kept = calibrate(bench, args.candidates)
            report["calibration"] = {"candidates_s": sorted(args.candidates), "tried": tried,
                                     "shortest_sustained_s": shortest}  # fmt: skip
            triggers = sorted({shortest, HEADLINE_TRIGGER})
            if kept is not None and "at_least_once" in args.modes:
                by_trigger[f"{shortest:g}"] = {"at_least_once": kept}
        report["trigger_intervals_s"] = triggers
        for trigger in triggers:
            done = by_trigger.setdefault(f"{trigger:g}", {})
            for mode in all_modes:
                if mode.name not in done:
                    done[mode.name] = bench.run(mode, trigger, args.epochs, crash=False)
        crash_runs: dict[str, Any] = {}
        if args.crash:
            crash_trigger = HEADLINE_TRIGGER if HEADLINE_TRIGGER in triggers else triggers[-1]
            for mode in all_modes:
                try:
                    crash_runs[mode.name] = bench.run(mode, crash_trigger, args.crash_epochs,
                                                      crash=True)  # fmt: skip
                except (RuntimeError, TimeoutError) as exc:
                    # Reported as such: the clean runs' figures are kept.
                    print(f"  crash run of {mode.name} failed: {exc}", flush=True)
                    crash_runs[mode.name] = {"error": str(exc)[-3000:]}
            report["crash_trigger_s"] = crash_trigger
        report["by_trigger"] = by_trigger
        judge_headline(report)
        report["crash_runs"] = crash_runs
        headline = HEADLINE_TRIGGER if HEADLINE_TRIGGER in triggers else triggers[-1]
        report["headline_trigger_s"] = headline
        report["modes"] = {}
        for name, clean in by_trigger[f"{headline:g}"].items():
            crashed = crash_runs.get(name)
            if crashed is not None and "error" in crashed:
                crashed = None
            source = crashed if crashed is not None else clean
            report["modes"][name] = {
                **{k: clean[k] for k in ("p50_ms", "p95_ms", "p99_ms", "rows_per_s", "cpu_s")},
                "duplicates": source["duplicates"],
                "missing": source["missing"],
                "duplicates_missing_from": "crash run" if crashed is not None else "clean run",
                "settled_s": crashed["settled_s"] if crashed is not None else None,
                "resumed_s": crashed["resumed_s"] if crashed is not None else None,
            }
        exactly_once = [n for n in report["modes"] if n != "at_least_once"]
        if {"at_least_once", "pull_and_diff"} <= report["modes"].keys():
            report["targets"] = targets(report["modes"], exactly_once)
            report["targets_by_trigger"] = {
                t: targets(found, exactly_once) for t, found in by_trigger.items()
                if {"at_least_once", "pull_and_diff"} <= found.keys()
            }  # fmt: skip
        report["cdf_ms"] = bench.cdf
        return report
    finally:
        server.stop()
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scale", type=float, default=0.01, help="TPC-H scale factor")
    p.add_argument("--epochs", type=int, default=60, help="files (micro-batches) per clean run")
    p.add_argument("--crash-epochs", type=int, default=30, help="files per crash run")
    p.add_argument(
        "--triggers",
        type=_floats,
        default=None,
        help="trigger intervals (s), comma-separated; default: calibrate + 1 s",
    )
    p.add_argument(
        "--candidates",
        type=_floats,
        default=[0.1, 0.25, 0.5, 0.75],
        help="intervals (s) tried for the shortest sustainable one",
    )
    p.add_argument(
        "--checkpoints",
        type=_floats,
        default=[1.0, 5.0, 30.0],
        help="two-phase checkpoint intervals (s)",
    )
    p.add_argument(
        "--modes",
        type=lambda s: [x for x in s.split(",") if x],
        default=None,
        help="a subset of the modes, comma-separated",
    )
    p.add_argument("--no-crash", dest="crash", action="store_false", help="skip the crash runs")
    p.add_argument("--seed", type=int, default=7, help="seeds the kill points and where files land")
    p.add_argument("--master", default="local[2,4]")
    p.add_argument("--workdir", type=Path, default=None, help="parent of the work folder")
    p.add_argument("--keep", action="store_true", help="keep the work folders")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument(
        "--quick",
        action="store_true",
        help="mark the report and plot as a quick run (small sizes, not to publish)",
    )
    p.add_argument(
        "--plot-only",
        action="store_true",
        help="run nothing: redraw latency_cdf.png from --out's latency.json",
    )
    return p  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.plot_only:
        saved = json.loads((args.out / "latency.json").read_text())
        if "cdf_quantiles_ms" not in saved:
            raise SystemExit(f"{args.out / 'latency.json'} keeps no CDF (cdf_quantiles_ms): it "
                             "predates them; only a new run can draw the plot")  # fmt: skip
        plot(saved, args.out)
        return 0
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    every = [m.name for m in modes(args.checkpoints, extra=True)]
    args.modes = args.modes or [m.name for m in modes(args.checkpoints)]
    unknown = set(args.modes) - set(every)
    if unknown:
        raise SystemExit(f"unknown modes {sorted(unknown)}; known: {every}")
    started = time.monotonic()
    report = run_all(args)
    report["runtime_s"] = round(time.monotonic() - started, 1)
    report["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    report["quick"] = args.quick
    report["cdf_quantiles_ms"] = cdf_quantiles(report.pop("cdf_ms"))
    write_report("latency", report, markdown(report), args.out)
    plot(report, args.out)
    print(json.dumps({"modes": report["modes"], "targets": report.get("targets")}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
