"""Fixture plugin: the JVM real-time writer compiled from this repository's source, per session.

The tests never download and never run the cached build in ``.venv/jars/realtime-writer``:
they compile ``jvm/realtime-writer``'s Java source with ``javac`` against pyspark's JARs
and the cached PostgreSQL JDBC driver (a few seconds), so the source under test, or a
mutant of it, is what runs.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO / "jvm" / "realtime-writer" / "src" / "main" / "java"
WRITER_JAR = "realtime-writer-1.jar"  # the cached build's name (scripts/fetch-jars)


def jdbc_jar() -> Path:
    """The cached PostgreSQL JDBC driver (a test fails, naming the script, without it)."""
    from reconcile.spark.jars import REALTIME_GROUP, require

    found = sorted(require(REALTIME_GROUP, "the JVM writer's tests").glob("postgresql-*.jar"))
    assert found, f"no PostgreSQL JDBC driver among the {REALTIME_GROUP} JARs (scripts/fetch-jars)"
    return found[-1]


def compile_writer(out: Path) -> Path:
    """Compile the writer's source into ``out``; the JAR of its classes."""
    import pyspark

    spark_jars = Path(pyspark.__file__).parent / "jars"
    classes = out / "classes"
    classes.mkdir(parents=True, exist_ok=True)
    sources = sorted(str(p) for p in SOURCE.rglob("*.java"))
    subprocess.run(
        ["javac", "-nowarn", "--release", "17", "-cp", f"{spark_jars}/*:{jdbc_jar()}",
         "-d", str(classes), *sources],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    jar = out / "realtime-writer-test.jar"
    subprocess.run(["jar", "cf", str(jar), "-C", str(classes), "."], check=True)
    return jar


def session_jars(writer: Path) -> list[str]:
    """``spark.jars`` for a session running ``writer`` instead of the cached build."""
    from reconcile.spark.jars import spark_jars

    return [j for j in spark_jars() if Path(j).name != WRITER_JAR] + [str(writer)]


@pytest.fixture(scope="session")
def realtime_writer_jar(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The JAR of the writer compiled from this repository's source."""
    return compile_writer(tmp_path_factory.mktemp("realtime-writer"))


@contextlib.contextmanager
def writer_classes(spark: Any, jar: Path) -> Iterator[Any]:
    """The session's JVM (py4j), resolving ``io.reconcile.realtime`` from ``jar`` meanwhile.

    A class loader of its own over ``jar`` and the JDBC driver, whose parent is the one of
    Spark's own classes and not the session's (which may hold the cached build): py4j
    resolves classes through the calling thread's context class loader, swapped for this
    one while the block runs (PySpark pins each Python thread to one JVM thread).
    """
    jvm = spark.sparkContext._jvm
    gateway = spark.sparkContext._gateway
    urls = gateway.new_array(jvm.java.net.URL, 2)
    urls[0] = jvm.java.io.File(str(jar)).toURI().toURL()
    urls[1] = jvm.java.io.File(str(jdbc_jar())).toURI().toURL()
    parent = jvm.java.lang.Class.forName("org.apache.spark.sql.Row").getClassLoader()
    loader = jvm.java.net.URLClassLoader(urls, parent)
    thread = jvm.java.lang.Thread.currentThread()
    before = thread.getContextClassLoader()
    thread.setContextClassLoader(loader)
    try:
        yield jvm
    finally:
        thread.setContextClassLoader(before)
        loader.close()
