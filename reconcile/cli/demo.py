"""``reconcile demo``: the TPC-H streaming demo, or the older file-sink demo (``--files``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from reconcile.core import interrupts
from reconcile.core.contract import ConfigurationError

__all__ = ["add_demo_parser", "run_demo_command"]


def add_demo_parser(commands: Any) -> None:
    demo = commands.add_parser(
        "demo",
        help="stream TPC-H lineitem through Spark into PostgreSQL exactly once "
        "(--chaos: under seeded kills and dropped COMMITs)",
        description=(
            "Stream TPC-H lineitem (tpchgen-cli) through Spark Structured Streaming into two "
            "PostgreSQL tables exactly once, optionally under seeded chaos (SIGKILLs of the "
            "pipeline, connections dropped around COMMIT), then verify both tables against "
            "the expected state and against TPC-H itself. --files runs the older demo: "
            "epochs into file sinks, no Spark and no Postgres."
        ),
    )
    demo.add_argument("--files", action="store_true",
                      help="the file-sink demo instead (options --out, --rows, --chaos-seed, "
                           "--no-chaos)")  # fmt: skip
    demo.add_argument("--epochs", type=int, default=None,
                      help="micro-batches (default 10; 20 with --files)")  # fmt: skip
    demo.add_argument("--scale", type=float, default=0.01, help="TPC-H scale (default 0.01)")
    demo.add_argument("--chaos", type=int, default=None, metavar="SEED",
                      help="kill the pipeline at seeded points and drop connections around "
                           "COMMIT")  # fmt: skip
    demo.add_argument("--crashes", type=int, default=4,
                      help="SIGKILLs of the pipeline with --chaos (default 4)")  # fmt: skip
    demo.add_argument("--drop-rate", type=float, default=0.15,
                      help="share of the sinks' COMMITs whose connection is dropped with "
                           "--chaos (default 0.15)")  # fmt: skip
    demo.add_argument("--interval", type=float, default=1.0,
                      help="seconds between two lineitem files (default 1)")  # fmt: skip
    demo.add_argument("--trigger", type=float, default=0.0,
                      help="Spark trigger interval in seconds (default 0: as soon as the last "
                           "batch is done)")  # fmt: skip
    demo.add_argument(
        "--pg",
        metavar="DSN",
        default=None,
        help="the sink database (default: an embedded throwaway server)",
    )
    demo.add_argument("--workdir", type=Path, default=None,
                      help="data, checkpoint and expected state (default: a temporary folder); "
                           "run again with the same --workdir and --pg to resume")  # fmt: skip
    demo.add_argument(
        "--keep", action="store_true", help="keep the embedded server and the temporary folder"
    )
    demo.add_argument(
        "--reset",
        action="store_true",
        help="drop the demo tables and markers of an earlier run in --pg first",
    )
    demo.add_argument("--source", choices=("files", "kafka"), default=None,
                      help="how lineitem reaches the pipeline: files dropped into a folder "
                      "(default), or records in a topic of a Kafka broker the run starts "
                      "(from the JARs scripts/setup cached)")  # fmt: skip
    demo.add_argument("--realtime", action="store_true",
                      help="lineitem through Kafka under Spark's Real-Time Mode into one table, "
                           "exactly once by offset markers; --chaos kills the pipeline mid-batch "
                           "(--crashes times)")  # fmt: skip
    demo.add_argument("--master", default="local[2,4]", help="Spark master (default local[2,4])")
    demo.add_argument("--via", choices=("auto", "executors", "driver"), default="auto",
                      help="how each micro-batch's rows are staged (write_stream's via=; default "
                           "auto: small batches collected to the driver)")  # fmt: skip
    demo.add_argument("--json", action="store_true", help="print the summary as JSON")
    demo.add_argument("--out", type=Path, default=Path("demo-out"), help="(--files) output folder")
    demo.add_argument("--rows", type=int, default=1000, help="(--files) orders per epoch")
    demo.add_argument("--chaos-seed", type=int, default=7, help="(--files) seed of the faults")
    demo.add_argument("--no-chaos", action="store_true", help="(--files) inject no faults")


def run_demo_command(args: argparse.Namespace) -> int:
    """Exit 0 when every epoch is in and both tables verify, 1 when they do not."""
    if args.files:
        return _files_demo(args)
    if args.realtime:
        return _realtime_demo(args)
    from reconcile.demo.tpch.summary import render
    from reconcile.demo.tpch.supervisor import run

    options = _tpch_options(args)
    # Interrupted, its pipeline process has committed epochs: they stay in
    # --pg (each exactly once), or go with the embedded server unless kept.
    interrupts.writing(
        "the epochs its pipeline committed stay, each once: run it again with the same "
        "--workdir and --pg to resume"
        if args.pg
        else "its epochs went into its embedded server, which "
        + ("is kept (--keep)" if args.keep else "is stopped and removed")
    )
    summary = run(options)
    if args.json:
        print(summary.to_json())
    else:
        render(summary)
    return 0 if summary.verified else 1


def _files_demo(args: argparse.Namespace) -> int:
    from reconcile.demo.files import report_json, run_demo

    epochs = 20 if args.epochs is None else args.epochs
    interrupts.writing(
        f"the epochs it committed stay in {args.out}, each once: run it again to resume"
    )
    if epochs < 1 or args.rows < 0:
        print("reconcile: error: --epochs must be >= 1 and --rows >= 0", file=sys.stderr)
        return 2
    report = run_demo(
        args.out,
        epochs=epochs,
        rows=args.rows,
        chaos_seed=None if args.no_chaos else args.chaos_seed,
    )
    if args.json:
        print(report_json(report))
    else:
        print(
            f"demo: {report.epochs} epochs x {report.rows_per_epoch} orders into "
            f"{report.out}/sinks in {report.seconds:.2f}s (resumed from epoch "
            f"{report.resumed_from})\n"
            f"chaos: {report.faults_planned} faults planned, {len(report.faults_fired)} fired "
            f"{report.faults_fired}; {report.restarts} restarts, {report.retries} retries\n"
            f"committed rows: {report.rows_committed}\n"
            f"audit: {'OK, every epoch exactly once' if report.audit_ok else 'FAILED'}"
        )
        for problem in report.audit_problems:
            print(f"  - {problem}")
    return 0 if report.audit_ok else 1


def _realtime_demo(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from reconcile.demo.tpch.realtime import run_realtime

    # WHY refused rather than ignored: each is a micro-batch setting (a file source, a
    # trigger, a staging path, a proxy dropping COMMITs) the realtime run has no use for.
    for flag, given in (
        ("--source files", args.source == "files"),
        ("--trigger", args.trigger),
        ("--via", args.via != "auto"),
        ("--drop-rate", args.drop_rate != 0.15),
    ):
        if given:
            raise ConfigurationError(f"{flag} does not apply to --realtime (Kafka, long batches)")
    options = replace(_tpch_options(args), source="kafka")
    interrupts.writing("its lines went into " + ("--pg, each once" if args.pg else
                       "its embedded server, which is stopped and removed"))  # fmt: skip
    summary = run_realtime(options)
    print(summary.to_json() if args.json else summary.render())
    return 0 if summary.verified else 1


def _tpch_options(args: argparse.Namespace) -> Any:
    """The TPC-H demo's ``Options`` from the command line, checked (the realtime one's too)."""
    from reconcile.demo.tpch.supervisor import Options

    epochs = 10 if args.epochs is None else args.epochs
    if epochs < 1 or args.scale <= 0 or args.crashes < 0 or args.interval < 0:
        raise ConfigurationError(
            "--epochs must be >= 1, --scale > 0, --crashes >= 0 and --interval >= 0"
        )
    return Options(
        scale=args.scale,
        epochs=epochs,
        interval=args.interval,
        trigger=args.trigger,
        chaos=args.chaos,
        crashes=args.crashes,
        drop_rate=args.drop_rate,
        pg=args.pg,
        workdir=args.workdir,
        keep=args.keep,
        reset=args.reset,
        master=args.master,
        via=args.via,
        progress=not args.json,
        source=args.source or "files",
    )
