"""``reconcile verify`` and ``reconcile repair``: pull-and-diff from the command line.

Exit codes suit cron and alerting: 0 no drift; 1 drift found (verify) or found
and repaired (repair); 2 an error, with one line that names what failed. With
``--json`` an error is also one object on stdout, with an ``error`` field; a
refusal (a store that lost rows, the mass-change brake) adds a ``refused``
field that says why (``reconcile.cli.command.report_failure``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from reconcile.cli.status import missing_store
from reconcile.core import interrupts
from reconcile.core.contract import ConfigurationError
from reconcile.core.target import Progress
from reconcile.recovery import ReconcileReport, recover
from reconcile.recovery.brake import Brake

__all__ = ["check_store", "provenance_lines", "run_on_spark", "run_recover", "summary"]


def check_store(root: str) -> None:
    """Refuse a store root that is not there, before anything connects.

    Without this, a mistyped ``--store`` reads as an empty store: "holds no
    epoch of it", which sends the operator looking at the pipeline instead
    of the path.

    Raises:
        ConfigurationError: the local path does not exist (or is no folder).
    """
    missing = missing_store(root)
    if missing is not None:
        raise ConfigurationError(f"{missing}: check --store; nothing was pulled or written")


@contextmanager
def _progress(enabled: bool, table: str) -> Iterator[Progress | None]:
    """A progress bar of the rows pulled, on stderr, only when it is a terminal."""
    if not enabled:
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        transient=True,
        console=None,
    ) as bar:
        task = bar.add_task(f"pulling {table}", total=None)

        def update(rows: int, total: int | None) -> None:
            bar.update(task, completed=rows, total=max(total or 0, rows) or None)

        yield update


def summary(report: ReconcileReport, *, repair: bool) -> str:
    """The report as a few readable lines."""
    found = (
        f"missing {report.missing}, extra {report.extra}, changed {report.changed}"
        if report.drift
        else "no drift"
    ) + (" in scope" if report.scope else "")
    lines = [
        f"{report.table}: {found} (against epoch {report.target_epoch})",
        f"  mode {report.mode}: {report.reason}",
        f"  pulled {report.rows_pulled} rows"
        + (
            f", compared {report.buckets_compared} bucket checksums "
            f"({report.buckets_differing} differed)"
            if report.buckets_compared
            else ""
        )
        + f" in {report.seconds:.2f}s",
        *(f"  warning: {text}" for text in report.warnings),
    ]
    if report.scope:
        lines.insert(
            2,
            f"  scope: {report.scope}; drift elsewhere in the table is not looked at "
            "(--mode full compares every row)",
        )
    if report.repair_wait_s:
        lines.insert(
            1,
            f"  waited {report.repair_wait_s:.2f}s for another repair of this table to finish "
            f"({report.repair_waited_for}): what is found here is what that repair left",
        )
    if report.mass_change:
        lines.append(
            f"  mass-change brake: {report.brake_counted} of the {report.sink_rows} rows would "
            f"be deleted or changed (the brake allows {report.brake_limit})"
            + ("; lifted for this repair" if repair else "; repair --allow-mass-change lifts it")
        )
    lines.extend(provenance_lines(report))
    if repair:
        lines.append(
            f"  repaired: {report.applied} rows written or deleted, in one transaction"
            if report.applied
            else "  nothing to write"
        )
    return "\n".join(lines)


def provenance_lines(report: ReconcileReport) -> list[str]:
    """The report's provenance section: one line per traced row, and why anything is unknown."""
    lines: list[str] = []
    traced = report.provenance
    if report.provenance_note and not traced:
        return [f"  provenance: {report.provenance_note}"] if report.drift else []
    if not traced:
        return lines
    differing = report.missing + report.extra + report.changed
    foreign = report.foreign_writes or 0
    if report.foreign_rows is not None and len(traced) < differing:
        # The traced rows are a sample: the count of every differing row first.
        lines.append(
            f"  foreign writes: {report.foreign_rows} of the {report.extra + report.changed} "
            f"changed and extra rows, by {report.foreign_transactions} transaction(s)"
        )
    lines.append(
        f"  provenance of {len(traced)} of the {differing} differing rows "
        f"({foreign} written by a foreign transaction):"
    )
    for row in traced:
        key = ", ".join(f"{k}={v!r}" for k, v in row["key"].items())
        columns = f" columns {', '.join(row['columns'])}" if row["columns"] else ""
        if row["writer"] == "none":
            lines.append(f"    {row['kind']} ({key}): {row['note']}")
            continue
        at = f"committed {row['committed_at']}" if row["committed_at"] else "commit time unknown"
        xid = f"xid {row['xid']}" if row["xid"] else "xid unknown"
        lines.append(f"    {row['kind']} ({key}){columns}: {xid}, {at}: {row['writer']}")
    if report.provenance_note:
        lines.append(f"    ({report.provenance_note})")
    return lines


def run_recover(args: argparse.Namespace) -> int:
    """Run ``verify`` or ``repair``; return the exit code (errors raise ReconcileError)."""
    repair = args.command == "repair"
    check_store(args.store)
    if args.spark:
        return run_on_spark(args)
    options: dict[str, Any] = {
        "mode": args.mode or "auto",
        "dry_run": not repair,
        "schema": args.schema,
        "allow_mass_change": repair and args.allow_mass_change,
        "chunk_rows": args.chunk_rows,
        "spill_dir": args.spill_dir,
        "provenance_rows": args.provenance_rows,
    }
    if args.epoch is not None:
        options["target_epoch"] = args.epoch
    with _progress(sys.stderr.isatty() and not args.json, args.table) as progress:
        report = recover(
            args.pg, args.store, args.pipeline, args.table, progress=progress, **options
        )
    if args.json:
        print(report.to_json())
    else:
        print(summary(report, repair=repair))
    return 1 if report.drift else 0


def run_on_spark(args: argparse.Namespace, spark: Any = None) -> int:
    """Run verify or repair (``args`` as the CLI parses them) on Spark; the exit code."""
    # Spark is an optional extra (reconcile-engine[spark]): imported for --spark only.
    from reconcile.cli.spark_job import check_spark_flags, session
    from reconcile.spark.verify import spark_recover

    check_spark_flags(args)
    on = spark if spark is not None else session(args.master or "local[*]")
    # PySpark put its own SIGINT handler in (it raises a bare KeyboardInterrupt).
    interrupts.reinstall()
    try:
        with interrupts.step(f"the Spark {args.command}", table=args.table):
            report = spark_recover(
                on,
                args.pg,
                args.store,
                args.pipeline,
                args.table,
                schema=args.schema,
                dry_run=args.command != "repair",
                partitions=args.partitions,
                brake=Brake(allow_mass_change=getattr(args, "allow_mass_change", False)),
                provenance_rows=args.provenance_rows,
            )
    except KeyboardInterrupt:
        # The executors' tasks are cancelled (their pulls end with their
        # sessions); a session this call started is stopped, not left to exit.
        # A JVM already going away may refuse either: the interruption is what
        # the caller must see.
        with contextlib.suppress(Exception):
            on.sparkContext.cancelAllJobs()
        if spark is None:
            with contextlib.suppress(Exception):
                on.stop()
        raise
    if args.json:
        out = report.as_dict()
        print(json.dumps(out, sort_keys=True, default=str))
    else:
        print(summary(report, repair=args.command == "repair"))
        stale = f", {report.stale} rows stale (run again)" if report.stale else ""
        print(f"  on Spark: {report.partitions} key ranges, {report.transactions} repair "
              f"transactions{stale}")  # fmt: skip
    if report.stale:
        return 2
    return 1 if report.drift else 0
