"""``reconcile verify|repair --spark``, and the same job for ``spark-submit``.

From the command line, ``--spark`` starts a Spark session (``--master``,
default ``local[*]``) and runs :func:`reconcile.spark.verify.spark_recover`.
On a cluster, submit this file with the same arguments as the command::

    job=$(python -c 'import reconcile.spark.job as j; print(j.__file__)')
    spark-submit --master spark://host:7077 "$job" verify --pg "$DSN" \\
        --store /shared/expected --pipeline orders --table order_lines --json

Exit codes as for the in-process commands: 0 no drift, 1 drift found (or
found and repaired), 2 an error, on one line with the password redacted;
130 or 143 when SIGINT or SIGTERM stopped it (its Spark jobs are cancelled
and a session it started is stopped first).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Sequence
from typing import Any

from reconcile import interrupts
from reconcile.contract import ConfigurationError

__all__ = ["main", "run_on_spark"]


def _session(master: str | None) -> Any:
    import os

    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName("reconcile-verify")
    if master:
        builder = builder.master(master)
    return builder.getOrCreate()


def run_on_spark(args: argparse.Namespace, spark: Any = None) -> int:
    """Run verify or repair (``args`` as the CLI parses them) on Spark; the exit code."""
    from reconcile.cli_recover import summary
    from reconcile.recovery.brake import Brake
    from reconcile.spark.verify import spark_recover

    if args.mode not in (None, "full", "auto"):
        raise ConfigurationError(
            f"--spark runs full mode (every key range pulled in parallel); --mode {args.mode} "
            "runs in-process: drop --spark"
        )
    if args.epoch is not None:
        raise ConfigurationError(
            "--spark compares the sink with its own newest marker's epoch; drop --epoch"
        )
    session = spark if spark is not None else _session(args.master or "local[*]")
    # PySpark put its own SIGINT handler in (it raises a bare KeyboardInterrupt).
    interrupts.reinstall()
    try:
        with interrupts.step(f"the Spark {args.command}", table=args.table):
            report = spark_recover(
                session,
                args.pg,
                args.store,
                args.pipeline,
                args.table,
                schema=args.schema,
                dry_run=args.command != "repair",
                partitions=args.partitions,
                brake=Brake(allow_mass_change=getattr(args, "allow_mass_change", False)),
            )
    except KeyboardInterrupt:
        # The executors' tasks are cancelled (their pulls end with their
        # sessions); a session this call started is stopped, not left to exit.
        # A JVM already going away may refuse either: the interruption is what
        # the caller must see.
        with contextlib.suppress(Exception):
            session.sparkContext.cancelAllJobs()
        if spark is None:
            with contextlib.suppress(Exception):
                session.stop()
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


def main(argv: Sequence[str] | None = None) -> int:
    """``spark-submit`` entry point: the CLI's verify/repair arguments; Spark's own master."""
    from reconcile import cli
    from reconcile.contract import ReconcileError

    args = cli._parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.command not in ("verify", "repair"):
        print("reconcile: error: the Spark job runs verify or repair", file=sys.stderr)
        return 2
    try:
        # spark-submit has set the master: getOrCreate() takes it as it is.
        return run_on_spark(args, spark=_session(args.master))
    except ReconcileError as exc:
        print(f"reconcile: error: {cli._one_line(str(exc))}", file=sys.stderr)
        return 2
    except Exception as exc:
        print(f"reconcile: error: {type(exc).__name__}: {cli._one_line(str(exc))}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
