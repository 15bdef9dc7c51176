"""Distributed verify and repair on a real cluster: two executor JVMs in processes of their own.

The job runs in a subprocess on ``local-cluster[2,1,1024]`` against a types table
(composite text + uuid key, every value type, NULLs) and is held against the
in-process verify at each step: the same counts clean, after hand drift, and
nothing left after the Spark repair. The server logs every connection, which
shows the pulls were opened by Python processes under an executor JVM, not by
the driver. An executor's own error (the snapshot it must import is gone)
reaches the driver as the engine's error type with its message.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.fix_pg import PgServer
from tests.recovery_setup import TYPES_DDL, TYPES_KEYS, TYPES_SCHEMA, make_setup, types_row

pytestmark = [pytest.mark.integration]

REPO = Path(__file__).resolve().parents[2]
COUNTS = ("missing", "extra", "changed")


@pytest.fixture
def logged_server() -> Any:
    server = PgServer(log_connections="on")
    yield server
    server.stop()


@pytest.mark.timeout(900)  # a driver and two executor JVMs, in a subprocess
@pytest.mark.spark  # in a subprocess
def test_spark_verify_and_repair_on_separate_executors(logged_server: Any, tmp_path: Path) -> None:
    dsn = logged_server.dsn(logged_server.create_database())
    setup = make_setup(dsn, str(tmp_path), "things", TYPES_SCHEMA, TYPES_DDL, TYPES_KEYS)
    rng = random.Random(20261124)
    setup.write([types_row(rng, region) for region in ("eu", "us", "ap", "sa") for _ in range(60)])
    setup.write([types_row(rng, "us") for _ in range(40)])
    proc = subprocess.run(
        [sys.executable, "-m", "tests.spark_cluster_job", dsn, str(tmp_path), "things",
         str(logged_server.root / "server.log")],
        cwd=REPO,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=900,
    )  # fmt: skip
    # The driver's Python traceback, if any, is the cause; the JVM's shutdown noise follows it.
    traceback = proc.stderr[proc.stderr.rfind("Traceback (most recent call last)") :]
    assert proc.returncode == 0, (traceback if "Traceback" in proc.stderr else proc.stderr)[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])

    def counts(report: dict[str, Any]) -> tuple[int, ...]:
        return tuple(report[k] for k in COUNTS)

    assert counts(out["spark_clean"]) == counts(out["local_clean"]) == (0, 0, 0)
    assert out["spark_clean"]["rows_pulled"] == out["local_clean"]["rows_pulled"] == 280
    drifted = counts(out["spark_drifted"])
    assert drifted == counts(out["local_drifted"])
    assert drifted[0] == 60 and drifted[1] == 1 and drifted[2] > 0  # eu deleted, one inserted
    repaired = out["spark_repaired"]
    assert counts(repaired) == drifted and repaired["applied"] == sum(drifted)
    assert repaired["transactions"] >= sum(drifted) // 7 and repaired["stale"] == 0
    assert counts(out["local_repaired"]) == (0, 0, 0)  # the in-process verify agrees

    assert out["fired"] == 1
    error = out["error"]
    assert error is not None and error["type"].startswith("reconcile.core.errors.")
    assert "on an executor" in error["message"] and "snapshot" in error["message"]

    processes = out["pull_processes"]
    assert processes and str(out["driver_pid"]) not in processes
    assert any(
        any("CoarseGrainedExecutorBackend" in line for line in chain)
        for chain in processes.values()
    ), processes
