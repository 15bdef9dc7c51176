"""Shared pytest set-up: fixture plugins and environment for Spark workers."""

from __future__ import annotations

import os
import sys

# Spark's Python workers must run this interpreter (and so this venv).
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

pytest_plugins = [
    "tests.fix_sinks",
    "tests.fix_spark",
    "tests.fix_delta",
    "tests.fix_pg",
    "tests.fix_chaos",
]
