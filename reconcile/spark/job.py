"""``reconcile verify|repair --spark``, and the same job for ``spark-submit``.

From the command line, ``--spark`` starts a Spark session (``--master``,
default ``local[*]``) and runs :func:`reconcile.spark.verify.spark_recover`:
for the one table of ``--pg/--store/--pipeline/--table``, or, with
``--config FILE``, for each sink table the file selects (one session for all;
:func:`spark_check`). The job runs full mode on PostgreSQL sinks; a mode,
an epoch or a sink it cannot run is refused, never dropped. On a cluster,
submit this file with the same arguments as the command::

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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from reconcile.core import interrupts
from reconcile.core.contract import ConfigurationError

if TYPE_CHECKING:
    from reconcile.cli.config import SinkTableConfig
    from reconcile.spark.verify import SparkReport

__all__ = ["OnSpark", "check_spark_flags", "main", "run_on_spark", "session", "spark_check"]


def session(master: str | None) -> Any:
    """The Spark session of the job (``master`` None: the one spark-submit set)."""
    return _session(master)


def _session(master: str | None) -> Any:
    import os

    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    # No console progress bar: stderr is for the one line that says what failed.
    builder = SparkSession.builder.appName("reconcile-verify")
    builder = builder.config("spark.ui.showConsoleProgress", "false")
    if master:
        builder = builder.master(master)
    spark = builder.getOrCreate()
    # Spark's default of 200 shuffle partitions turns the join of a small table
    # into 200 Python tasks (a minute on two cores for 50 rows). Unless the
    # user set it, the join gets as many partitions as the cluster has cores.
    if not spark.sparkContext.getConf().contains("spark.sql.shuffle.partitions"):
        spark.conf.set("spark.sql.shuffle.partitions", str(spark.sparkContext.defaultParallelism))
    return spark


def check_spark_flags(args: argparse.Namespace) -> None:
    """Refuse what the Spark job cannot do, before a session starts.

    Raises:
        ConfigurationError: ``--mode`` scoped or buckets, or ``--epoch``.
    """
    if args.mode not in (None, "full", "auto"):
        raise ConfigurationError(
            f"--spark runs full mode (every key range pulled in parallel); --mode {args.mode} "
            "runs in-process: drop --spark"
        )
    if args.epoch is not None:
        raise ConfigurationError(
            "--spark compares the sink with its own newest marker's epoch; drop --epoch"
        )


@dataclass(frozen=True)
class OnSpark:
    """Where ``--config --spark`` runs each table: the session, and key ranges per table."""

    spark: Any  # SparkSession
    partitions: int | None = None


def spark_check(
    on: OnSpark, sink: SinkTableConfig, *, repair: bool, allow_mass_change: bool
) -> SparkReport:
    """Verify (or repair) one config file's sink table on Spark, in full mode.

    The table's own configured mode is not used: the job pulls every key range
    (the report's ``mode`` says "full"). Its brake (``max_change_fraction``)
    holds as in-process.

    Raises:
        ConfigurationError: the sink is not a PostgreSQL table (the job pulls
            with COPY from executors), naming the sink and its connection.
        ReconcileError: whatever ``spark_recover`` raises for the table.
    """
    from reconcile.cli.config_sinks import split_table
    from reconcile.recovery.api import is_postgres
    from reconcile.recovery.brake import Brake
    from reconcile.spark.verify import spark_recover

    dsn = sink.connection.get_secret_value()
    if not is_postgres(dsn):
        raise ConfigurationError(
            f"{sink.pipeline}.{sink.name}: --spark runs on PostgreSQL sink tables, and this "
            f"one is at {sink.connection}: check it without --spark"
        )
    schema, name = split_table(sink.table)
    return spark_recover(
        on.spark,
        dsn,
        sink.store,
        sink.pipeline,
        name,
        sink=sink.name,
        keys=sink.keys,
        schema=schema,
        dry_run=not repair,
        partitions=on.partitions,
        brake=Brake(sink.max_change_fraction, allow_mass_change=allow_mass_change),
    )


def run_on_spark(args: argparse.Namespace, spark: Any = None) -> int:
    """Run verify or repair (``args`` as the CLI parses them) on Spark; the exit code."""
    from reconcile.cli.recover import summary
    from reconcile.recovery.brake import Brake
    from reconcile.spark.verify import spark_recover

    check_spark_flags(args)
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
    from reconcile.cli import command as cli

    args = cli._parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.command not in ("verify", "repair"):
        print("reconcile: error: the Spark job runs verify or repair", file=sys.stderr)
        return 2
    args.spark = True  # submitted, it runs on Spark whether or not --spark was given
    try:
        # The session first: spark-submit has set the master, and getOrCreate()
        # takes it as it is (a later --master default does not replace it).
        _session(args.master)
        return cli.run_verify_repair(args)
    except Exception as exc:
        return cli.report_failure(args, exc)


if __name__ == "__main__":
    sys.exit(main())
