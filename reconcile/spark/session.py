"""A local SparkSession set up the way the engine's own jobs expect (the demo, the benchmarks)."""

from __future__ import annotations

import os
import sys
from typing import Any

from reconcile.spark.jars import (
    DELTA_CONF,
    DELTA_GROUP,
    S3_GROUP,
    group_folder,
    s3a_settings,
    spark_jars,
)

__all__ = ["local_session"]


def local_session(app_name: str = "reconcile", master: str = "local[2]", **conf: str) -> Any:
    """Start (or return) a Spark session for one machine (``local[2]`` by default).

    UI and console progress off, Arrow on, UTC, 4 shuffle partitions, the
    running interpreter for the Python workers, and the connectors cached in the
    venv (``reconcile.spark.jars``: Kafka, and Delta with its SQL extension and
    catalog, so that ``format("delta")`` reads a store table) on the classpath. ``conf`` adds or
    overrides settings (dots as in Spark's keys). Raises whatever Spark raises
    if it cannot start.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.default.parallelism", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.sql.execution.arrow.pyspark.fallback.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "2g")
        .config("spark.driver.extraJavaOptions", "-Duser.timezone=UTC")
        .config("spark.executor.extraJavaOptions", "-Duser.timezone=UTC")
        .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable)
    )
    jars = spark_jars()
    if jars:
        builder = builder.config("spark.jars", ",".join(jars))
    if any(group_folder(DELTA_GROUP).glob("*.jar")):
        for key, value in DELTA_CONF.items():
            builder = builder.config(key, value)
    if any(group_folder(S3_GROUP).glob("*.jar")):
        for key, value in s3a_settings(os.environ).items():
            builder = builder.config(f"spark.hadoop.{key}", value)
    for key, value in conf.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()
