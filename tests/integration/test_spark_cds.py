"""The tests' JVMs map Spark's classes from the archive that scripts/setup writes once."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import spark_cds

pytestmark = [pytest.mark.integration]

START = """
from pyspark.sql import SparkSession
spark = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
assert spark.range(10).count() == 10
spark.stop()
"""


@pytest.mark.spark  # in a subprocess
def test_a_spark_start_loads_its_classes_from_the_archive(tmp_path: Path) -> None:
    assert spark_cds.archive().exists(), "no Spark class archive: run scripts/setup"
    opts = spark_cds.submit_opts()
    assert f"-XX:SharedArchiveFile={spark_cds.archive()}" in opts
    loaded = tmp_path / "classes.log"
    # -Xshare:on: a JVM that cannot map the archive fails instead of going on without it.
    logged = f"{opts} -Xshare:on -Xlog:class+load=info:file={loaded}"
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_SUBMIT_OPTS": logged}
    done = subprocess.run([sys.executable, "-c", START], env=env, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    lines = loaded.read_text().splitlines()
    # Spark's classes from its jars; the lambdas' classes are made as the JVM runs.
    spark = [line for line in lines if " org.apache.spark." in line and "$$Lambda$" not in line]
    from_archive = [line for line in spark if "shared objects file (top)" in line]
    # Nearly all of them come from the archive, parsed and verified once.
    assert len(spark) > 1000, len(spark)
    assert len(from_archive) > 0.9 * len(spark), (len(spark), len(from_archive))
