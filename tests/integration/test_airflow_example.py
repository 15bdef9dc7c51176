"""The Airflow example's command is what a task runs: spark-submit of the engine's job, for real."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.recovery_setup import SIMPLE_DDL, SIMPLE_SCHEMA, make_setup

# spark-submit of the job: a JVM of its own.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]


def load_example() -> object:
    spec = importlib.util.spec_from_file_location(
        "airflow_verify_dag", REPO / "examples" / "airflow_verify_dag.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.spark  # in a subprocess
def test_the_dag_command_runs_the_spark_job(pg_db: str, tmp_path: Path) -> None:
    example = load_example()
    setup = make_setup(pg_db, str(tmp_path), "orders", SIMPLE_SCHEMA, SIMPLE_DDL, ["id"])
    setup.write([{"id": i, "name": f"n{i}", "total": i} for i in range(100)])
    setup.execute("DELETE FROM {t} WHERE id < 3")
    command = example.verify_command(  # type: ignore[attr-defined]
        "orders", master="local[2]", store=str(tmp_path), pipeline="shop", dsn_env="BENCH_DSN"
    )
    assert command.startswith("spark-submit --master 'local[2]' ") and '"$BENCH_DSN"' in command
    assert pg_db not in command  # the DSN stays in the environment
    bindir = Path(sys.executable).parent  # spark-submit comes with pyspark, in the venv
    proc = subprocess.run(
        ["bash", "-c", command],
        env={**os.environ, "BENCH_DSN": pg_db, "PATH": f"{bindir}:{os.environ['PATH']}",
             "PYSPARK_PYTHON": sys.executable, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=600,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-3000:]  # drift found
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (report["missing"], report["extra"], report["changed"]) == (3, 0, 0)
