"""Fixture plugin: the one local Spark session shared by every Spark test."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest

# Spark's Python workers must run this interpreter (conftest sets it too; a plugin
# may be imported on its own, e.g. by a benchmark).
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


def build_local_session(
    app_name: str = "reconcile-tests", master: str = "local[2]", **conf: str
) -> Any:
    """Start (or return) a Spark session tuned for small tests (``local[2]`` by default).

    ``reconcile.spark.session.local_session`` with the tests' app name. Raises
    whatever Spark raises if it cannot start: a test that needs Spark must
    fail, never skip, when Spark is missing.
    """
    from reconcile.spark.session import local_session

    return local_session(app_name, master, **conf)


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The shared ``local[2]`` SparkSession (UI off, Arrow on, UTC, 4 shuffle partitions).

    One per pytest process: each xdist worker starts its own, with its scratch
    space and warehouse in the worker's own temp folder (the JVM picks free
    ports for the driver and block manager; the UI, the one fixed port, is off).
    """
    scratch = tmp_path_factory.mktemp("spark")
    session = build_local_session(
        **{
            "spark.local.dir": str(scratch / "local"),
            "spark.sql.warehouse.dir": str(scratch / "warehouse"),
        }
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
