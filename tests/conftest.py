"""Shared pytest set-up: fixture plugins and environment for Spark workers."""

from __future__ import annotations

import os
import sys

# Spark's Python workers must run this interpreter (and so this venv).
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

# Every JVM a test starts (the shared session's, and Spark's in the pipelines,
# the CLI and the demo that tests run in subprocesses, which inherit this) lives
# for seconds to a few minutes and spends most of its CPU compiling code it runs
# a few times: C1 alone compiles far less, and the serial collector runs no GC
# threads. Measured on 2 cores: a stream pipeline run took 40 CPU seconds with
# the defaults and 23 with these (docs/testing.md). What runs is the same; only
# the JIT's work differs. Tests only: the benchmarks keep the JVM's defaults.
# A value set by the user wins.
os.environ.setdefault("SPARK_SUBMIT_OPTS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")

pytest_plugins = [
    "tests.fix_sinks",
    "tests.fix_spark",
    "tests.fix_delta",
    "tests.fix_pg",
    "tests.fix_chaos",
    "tests.fix_schedule",
    "tests.fix_tiers",
]
