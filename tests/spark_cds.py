"""The JVM options of every Spark the tests start, and a class archive that makes starts cheaper.

Every JVM a test starts (the shared session's, and Spark's in the pipelines,
the CLI and the demo that tests run in subprocesses, which inherit
``SPARK_SUBMIT_OPTS``) lives for seconds to a few minutes and spends most of
its CPU on start-up: loading and verifying some ten thousand classes, and
compiling code it runs a few times. So the tests run it with:

- C1 alone (``-XX:TieredStopAtLevel=1``), which compiles far less, and the
  serial collector, which runs no GC threads: a stream pipeline run took 40
  CPU seconds with the defaults and 23 with these;
- a dynamic class-data-sharing archive (JDK 13 and later: ``-XX:ArchiveClassesAtExit``
  once, then ``-XX:SharedArchiveFile``): the classes a small Spark job loads,
  parsed and verified once and mapped by every later JVM. A session start and a
  small job took 13 to 16 JVM CPU seconds without it and 9 with it, on 2 cores.

What runs is the same; only the JVM's own work differs. ``scripts/setup``
writes the archive (``python -m tests.spark_cds``, half a minute, once per
venv); it lives in the venv, named for the Java binary, the Spark jars and the
options, so an upgrade of either gets an archive of its own. Without it the
options are the first two alone. A JVM that cannot map the archive runs
without it (``-Xshare:auto``, the default), quietly: the archive's own log
tags are off, since some tests read what a Spark process prints.

Tests only: the benchmarks keep the JVM's defaults, as a user's Spark would.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = ["JVM_OPTIONS", "archive", "submit_opts"]

JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"

# What the archive is made from: a session, a shuffle, Arrow both ways, Parquet, a
# micro-batch of a stream into foreachBatch; the classes most tests load.
_WORKLOAD = """
import sys, tempfile
from pyspark.sql import SparkSession
spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
         .config("spark.sql.shuffle.partitions", "4")
         .config("spark.sql.execution.arrow.pyspark.enabled", "true").getOrCreate())
df = spark.createDataFrame([(i, str(i), i * 0.5) for i in range(2000)],
                           "k long, v string, x double")
df.groupBy((df.k % 7).alias("g")).count().collect()
df.toPandas()
with tempfile.TemporaryDirectory() as folder:
    df.write.parquet(folder + "/t")
    spark.read.parquet(folder + "/t").orderBy("k").limit(3).collect()
    stream = spark.readStream.format("rate").option("rowsPerSecond", 10).load()
    seen = []
    query = (stream.writeStream.foreachBatch(lambda batch, epoch: seen.append(batch.count()))
             .option("checkpointLocation", folder + "/cp").trigger(once=True).start())
    query.awaitTermination(120)
spark.stop()
"""


def _jars() -> list[str]:
    # Found, not imported: every pytest start (hundreds in the mutation check) asks.
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise ImportError("no pyspark in this venv")
    folder = Path(spec.origin).parent / "jars"
    return sorted(p.name for p in folder.glob("*.jar"))


def archive() -> Path:
    """Where this venv keeps the archive for this Java, these Spark jars and these options."""
    java = shutil.which("java") or ""
    java_home = os.environ.get("JAVA_HOME", "")
    seen = "\n".join([os.path.realpath(java), java_home, JVM_OPTIONS, *_jars()])
    digest = hashlib.sha256(seen.encode()).hexdigest()[:16]
    return Path(sys.prefix) / "spark-cds" / f"{digest}.jsa"


def submit_opts() -> str:
    """``SPARK_SUBMIT_OPTS`` for the tests: the options, and the archive when it was written."""
    try:
        path = archive()
    except ImportError:  # no pyspark in this venv: nothing starts a JVM
        return JVM_OPTIONS
    return f"{JVM_OPTIONS} -XX:SharedArchiveFile={path} {QUIET}" if path.exists() else JVM_OPTIONS


def write_archive() -> Path:
    """Run the workload once with ``-XX:ArchiveClassesAtExit``; the archive, moved into place.

    Raises:
        RuntimeError: the workload failed, or its JVM wrote no archive.
    """
    path = archive()
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as folder:
        written = Path(folder) / path.name
        dump = f"{JVM_OPTIONS} -XX:ArchiveClassesAtExit={written} {QUIET}"
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_SUBMIT_OPTS": dump}
        done = subprocess.run([sys.executable, "-c", _WORKLOAD], env=env, capture_output=True,
                              text=True, timeout=600)  # fmt: skip
        if done.returncode != 0 or not written.exists():
            raise RuntimeError(f"no Spark class archive: {done.stderr.strip()[-2000:]}")
        written.replace(path)  # whole or not at all: a test run may be starting beside
    for old in path.parent.glob("*.jsa"):
        if old != path:  # another Java's or Spark's, 150 MB each
            old.unlink()
    return path


def main() -> int:
    path = archive()
    if path.exists():
        return 0
    print("setup: writing the Spark class archive for the tests' JVMs", file=sys.stderr)
    try:
        written = write_archive()
    except (RuntimeError, subprocess.TimeoutExpired) as err:
        # The tests run without it, only with dearer JVM starts.
        print(f"setup: warning: {err}", file=sys.stderr)
        return 0
    print(f"setup: {written} ({written.stat().st_size >> 20} MiB)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
