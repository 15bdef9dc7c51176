"""The Real-Time Mode benchmark's command line: the modes, the run, the report files."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.realtime.bench import Bench, make_base, remove
from benchmarks.realtime.report import judge, markdown, plot
from benchmarks.realtime_probe import build_jar
from benchmarks.report import RESULTS, machine, now, versions, write_report

__all__ = ["main", "modes"]


def modes(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The modes to run, in order, each ``{mode, kind, rows_per_txn, ms_per_txn, trigger_s,
    checkpoint_s}``."""
    base = {"rows_per_txn": 100, "ms_per_txn": 100, "trigger_s": args.trigger, "checkpoint_s": 0.0}
    found = [
        {
            **base,
            "mode": "rtm_at_least_once",
            "kind": "rtm_at_least_once",
            "rows_per_txn": args.alo_rows_per_txn,
        },
        {**base, "mode": "rtm_exactly_once", "kind": "rtm_exactly_once"},
    ]
    if args.small_ms:
        found.append(
            {
                **base,
                "mode": f"rtm_exactly_once_{args.small_ms}ms",
                "kind": "rtm_exactly_once",
                "ms_per_txn": args.small_ms,
            }
        )
    found += [
        {**base, "mode": "microbatch_pull_and_diff", "kind": "microbatch"},
        {
            **base,
            "mode": f"two_phase_{args.checkpoint:g}s",
            "kind": "two_phase",
            "checkpoint_s": args.checkpoint,
        },
    ]
    return found


def run_all(args: argparse.Namespace) -> dict[str, Any]:
    base = make_base()
    load_start = [round(x, 2) for x in os.getloadavg()]
    began = time.monotonic()
    jar = build_jar("InsertWriter", base / "jar")
    bench = Bench(args, base, jar)
    results: dict[str, Any] = {}
    try:
        for spec in modes(args):
            results[spec["mode"]] = bench.run_mode(spec)
    finally:
        bench.close()
        remove(base)
    report: dict[str, Any] = {
        "benchmark": "realtime",
        "quick": args.quick,
        "when": now(),
        "command": " ".join(["python -m benchmarks.realtime", *args.argv]),
        "machine": machine(
            load_average_at_start=load_start,
            load_average_at_end=[round(x, 2) for x in os.getloadavg()],
            shared="2 cores shared with other concurrent work (see the load averages)",
        ),
        "versions": versions("pyspark", "psycopg", "confluent-kafka"),
        "scale": {
            "rate_per_s": args.rate,
            "warmup_s": args.warmup,
            "duration_s": args.duration,
            "partitions": 2,
            "master": "local[2]",
            "rtm_batch": args.rtm_batch,
        },
        "took_s": round(time.monotonic() - began, 1),
        "modes": results,
    }
    report["targets"] = judge(report)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.realtime",
        description=(sys.modules["benchmarks.realtime"].__doc__ or "").strip(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run: a few seconds a mode")
    parser.add_argument("--rate", type=float, default=None, help="records/s (default 10000)")
    parser.add_argument("--duration", type=float, default=None, help="measured s a mode (60)")
    parser.add_argument("--warmup", type=float, default=None, help="paced s left out (10)")
    parser.add_argument("--rtm-batch", default="5 seconds", help="Real-Time Mode's batch")
    parser.add_argument(
        "--trigger",
        type=float,
        default=0.2,
        help="micro-batch trigger, s, of the micro-batch modes",
    )
    parser.add_argument(
        "--checkpoint",
        type=float,
        default=None,
        help="two-phase commit's checkpoint interval, s (30)",
    )
    parser.add_argument(
        "--small-ms",
        type=int,
        default=None,
        help="a second exactly-once setting's ms_per_txn (20; 0: none)",
    )
    parser.add_argument(
        "--alo-rows-per-txn",
        type=int,
        default=100,
        help="rtm_at_least_once's rows a transaction (1: each row in autocommit)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    defaults = (
        {"rate": 200, "duration": 4, "warmup": 1, "checkpoint": 3, "small_ms": 0}
        if args.quick
        else {"rate": 10_000, "duration": 60, "warmup": 10, "checkpoint": 30, "small_ms": 20}
    )
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    report = run_all(args)
    args.out.mkdir(parents=True, exist_ok=True)
    write_report("realtime", report, markdown(report), args.out)
    plot(report, args.out / "realtime_cdf.png")
    print(markdown(report))
    return 0
