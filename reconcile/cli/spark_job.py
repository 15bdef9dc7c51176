"""``reconcile verify|repair --spark``: the Spark session and the config file's tables on Spark.

``--spark`` starts a Spark session (``--master``, default ``local[*]``) and
runs :func:`reconcile.spark.verify.spark_recover`: for the one table of
``--pg/--store/--pipeline/--table`` (``reconcile.cli.recover.run_on_spark``),
or, with ``--config FILE``, for each sink table the file selects (one session
for all; :func:`spark_check`). The job runs full mode on sinks whose backend
can be pulled from Spark's executors (PostgreSQL); a mode, an epoch or a sink
it cannot run is refused, never dropped. ``reconcile.cli.spark_submit`` is
the same job for ``spark-submit``.

pyspark is imported only when a session starts: it is an optional extra.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Any

from reconcile.cli.config import SinkTableConfig
from reconcile.cli.config_sinks import split_table
from reconcile.core.contract import ConfigurationError
from reconcile.recovery.brake import Brake
from reconcile.recovery.provenance import DEFAULT_PROVENANCE_ROWS
from reconcile.spark.verify import SparkReport, spark_recover
from sinks import registry
from sinks.base import SPARK_PULL

__all__ = ["OnSpark", "check_spark_flags", "session", "spark_check"]


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
    provenance_rows: int = DEFAULT_PROVENANCE_ROWS  # differing rows traced to their writer


def spark_check(
    on: OnSpark, sink: SinkTableConfig, *, repair: bool, allow_mass_change: bool
) -> SparkReport:
    """Verify (or repair) one config file's sink table on Spark, in full mode.

    The table's own configured mode is not used: the job pulls every key range
    (the report's ``mode`` says "full"). Its brake (``max_change_fraction``)
    holds as in-process.

    Raises:
        ConfigurationError: the sink's backend cannot be pulled from Spark's
            executors (only PostgreSQL's declares it: COPY from each task),
            naming the sink and its connection.
        ReconcileError: whatever ``spark_recover`` raises for the table.
    """
    dsn = sink.connection.get_secret_value()
    if not registry.provides(dsn, SPARK_PULL):
        # The executors pull key ranges, each with its own connection: only a
        # backend that declares it can be checked this way.
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
        provenance_rows=on.provenance_rows,
    )
