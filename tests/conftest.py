"""Shared pytest set-up: fixture plugins and environment for Spark workers."""

from __future__ import annotations

import os
import signal
import sys

from tests import spark_cds

# Spark's Python workers must run this interpreter (and so this venv).
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

# Every JVM a test starts (the shared session's, and Spark's in the subprocesses,
# which inherit this) spends most of its CPU starting: tests/spark_cds.py says what
# these options save. A value set by the user wins.
os.environ.setdefault("SPARK_SUBMIT_OPTS", spark_cds.submit_opts())

# Every test process (and the mutation check starts hundreds) would otherwise initdb
# a template of its own: the venv keeps one for these binaries (reconcile.demo.embedded_pg).
os.environ.setdefault("RECONCILE_PG_TEMPLATE_CACHE", os.path.join(sys.prefix, "pg-template"))

# A shell starts a background job (`cmd &`, as .ci/run starts its steps side by side)
# with SIGINT ignored, and Python then leaves it ignored: the interrupt tests would
# find no SIGINT to catch, and every command a test starts would inherit the
# ignore (a `reconcile run` then keeps PySpark's SIGINT handler, not its own).
# The tests run as a terminal starts them: SIGINT raises KeyboardInterrupt.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

pytest_plugins = [
    "tests.fix_sinks",
    "tests.fix_s3",
    "tests.fix_spark",
    "tests.fix_delta",
    "tests.fix_delta_spark",
    "tests.fix_iceberg",
    "tests.fix_pg",
    "tests.fix_mariadb",
    "tests.fix_kafka",
    "tests.fix_realtime",
    "tests.fix_chaos",
    "tests.fix_schedule",
    "tests.fix_tiers",
]
