"""Real-Time Mode probe: does a ``foreach`` writer run under it, and how soon is a row visible?

``python -m benchmarks.realtime_probe [VARIANT ...]``, each VARIANT
``MODE,KIND,MASTER,PARTS[,CONF=V...]`` (for example
``update,class,local[2],2,spark.buffer.size=256``; KIND ``class`` or ``function``), or
``jvm`` for the Java ``ForeachWriter`` in ``benchmarks/realtime_jvm/`` (compiled here
with ``javac`` against the venv's Spark JARs), or ``markers`` for the engine's
exactly-once JVM writer (``start_realtime(writer="jvm")``, the build of
``scripts/fetch-jars``; ``markers,ROWS,MS`` for transactions of at most ROWS rows or MS
ms, 100 and 100 by default). It starts a
throwaway Kafka broker and PostgreSQL, produces ``EVENTS`` records stamped with their
production time at about 40 a second, and prints, per variant, Spark's error if it
refuses the query, or the p50/p99 of production to visibility (a PostgreSQL row inserted
in autocommit, at-least-once; for ``jvm``, the row reaching the writer; for ``markers``,
the row inserted in its transaction, which commits right after) and the rows visible per
second. docs/realtime.md has the numbers.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

EVENTS = 300
HERE = Path(__file__).resolve().parent


def produce(bootstrap: str, topic: str, partitions: int) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    for i in range(EVENTS):
        producer.produce(topic, value=repr(time.time()).encode(), partition=i % partitions)
        producer.poll(0)
        producer.flush(5)
        time.sleep(0.02)


def percentiles(latencies_ms: list[float]) -> dict[str, Any]:
    lat = sorted(latencies_ms)

    def at(p: float) -> float | None:
        return round(lat[min(len(lat) - 1, int(p * len(lat)))], 1) if lat else None

    return {"rows": len(lat), "p50_ms": at(0.5), "p99_ms": at(0.99)}


class Writer:
    """At-least-once: one autocommit INSERT per row."""

    def __init__(self, dsn: str, tag: str) -> None:
        self.dsn, self.tag = dsn, tag

    def open(self, partition_id: int, epoch_id: int) -> bool:
        import psycopg

        self.conn = psycopg.connect(self.dsn, autocommit=True)
        return True

    def process(self, row: Any) -> None:
        self.conn.execute(
            "INSERT INTO ev (part, off, produced, tag) VALUES (%s, %s, %s, %s)",
            (row.partition, row.offset, float(row.value), self.tag),
        )

    def close(self, error: BaseException | None) -> None:
        self.conn.close()


def as_function(dsn: str, tag: str) -> Any:
    def write(row: Any) -> None:
        import psycopg

        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO ev (part, off, produced, tag) VALUES (%s, %s, %s, %s)",
                (row.partition, row.offset, float(row.value), tag),
            )

    return write


def python_variant(variant: str, broker: Any, dsn: str) -> dict[str, Any]:
    import psycopg

    from tests.fix_kafka import create_topic
    from tests.fix_spark import build_local_session

    mode, kind, master, parts_text, *confs = variant.split(",")
    parts = int(parts_text)
    spark = build_local_session(
        "realtime-probe", master=master, **dict(c.split("=", 1) for c in confs)
    )
    spark.sparkContext.setLogLevel("ERROR")
    topic = create_topic(broker, "rt", parts)
    tag = f"{variant}-{time.time()}"
    frame = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", broker.bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .load()
        .selectExpr("partition", "offset", "CAST(value AS STRING) AS value")
    )
    writer = (
        frame.writeStream.outputMode(mode)
        .trigger(realTime="5 seconds")
        .option("checkpointLocation", tempfile.mkdtemp(prefix="rt-probe-"))
        .foreach(Writer(dsn, tag) if kind == "class" else as_function(dsn, tag))
    )
    try:
        query = writer.start()
    except Exception as err:  # the refusal is the finding
        spark.stop()
        return {"refused": f"{type(err).__name__}: {err}"}
    time.sleep(15)  # the first long batch is running
    produce(broker.bootstrap, topic, parts)
    deadline = time.monotonic() + 60
    with psycopg.connect(dsn, autocommit=True) as conn:
        while time.monotonic() < deadline and query.exception() is None:
            found = conn.execute("SELECT count(*) FROM ev WHERE tag = %s", (tag,)).fetchone()
            if found is not None and found[0] >= EVENTS:
                break
            time.sleep(0.5)
        lat = conn.execute(
            "SELECT (extract(epoch FROM visible) - produced) * 1000 FROM ev WHERE tag = %s",
            (tag,),
        ).fetchall()
        per_second = conn.execute(
            "SELECT to_char(date_trunc('second', visible), 'MI:SS'), count(*) FROM ev "
            "WHERE tag = %s GROUP BY 1 ORDER BY 1",
            (tag,),
        ).fetchall()
    result = percentiles([float(x[0]) for x in lat])
    result["visible_per_second"] = per_second
    error = query.exception()
    result["error"] = str(error)[:2000] if error is not None else None
    query.stop()
    spark.stop()
    return result


def build_jar(name: str, build: Path) -> Path:
    """Compile ``realtime_jvm/NAME.java`` against the venv's Spark and JDBC JARs into a JAR.

    Returns the JAR's path, in ``build`` (its classes beside it).
    """
    import pyspark

    from reconcile.spark.jars import spark_jars

    jars = [*glob.glob(str(Path(pyspark.__file__).parent / "jars" / "*.jar")), *spark_jars()]
    classes = build / "classes"
    source = HERE / "realtime_jvm" / f"{name}.java"
    subprocess.run(["javac", "-cp", ":".join(jars), "-d", str(classes), str(source)], check=True)
    jar = build / f"{name}.jar"
    subprocess.run(["jar", "cf", str(jar), "-C", str(classes), "."], check=True)
    return jar


def jvm_variant(broker: Any) -> dict[str, Any]:
    from reconcile.spark.jars import spark_jars
    from tests.fix_kafka import create_topic
    from tests.fix_spark import build_local_session

    build = Path(tempfile.mkdtemp(prefix="rt-probe-jvm-"))
    jar = build_jar("StampWriter", build)
    spark = build_local_session(
        "realtime-probe-jvm",
        master="local[2]",
        **{"spark.jars": ",".join([*spark_jars(), str(jar)])},
    )
    topic = create_topic(broker, "rt", 2)
    frame = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", broker.bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .load()
        .selectExpr("partition", "offset", "CAST(value AS STRING) AS value")
    )
    jvm = spark._jvm
    stamps = str(build / "stamps")
    query = (
        frame._jdf.writeStream()
        .outputMode("update")
        .foreach(jvm.probe.StampWriter(stamps))
        .option("checkpointLocation", str(build / "checkpoint"))
        .trigger(jvm.org.apache.spark.sql.streaming.Trigger.RealTime("5 seconds"))
        .start()
    )
    time.sleep(15)
    produce(broker.bootstrap, topic, 2)
    time.sleep(8)
    lat = []
    for path in glob.glob(stamps + "-*"):
        for line in Path(path).read_text().splitlines():
            _, _, produced, seen = line.split()
            lat.append(int(seen) - float(produced) * 1000)
    query.stop()
    spark.stop()
    return percentiles(lat)


def markers_variant(broker: Any, dsn: str, variant: str) -> dict[str, Any]:
    """The engine's JVM writer, exactly once: latency to the row's insert in its transaction.

    ``variant`` is ``markers`` or ``markers,ROWS_PER_TXN,MS_PER_TXN`` (100 and 100 by default).
    """
    import psycopg
    from confluent_kafka import Producer

    from reconcile.spark.realtime import start_realtime
    from sinks.realtime import RealtimeTarget
    from tests.fix_kafka import create_topic
    from tests.fix_spark import build_local_session

    spark = build_local_session("realtime-probe-markers", master="local[2]")
    spark.sparkContext.setLogLevel("ERROR")
    topic = create_topic(broker, "rt", 2)
    tag = f"markers-{time.time()}"
    frame = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", broker.bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .load()
        .selectExpr(
            "topic",
            "partition",
            "offset",
            "partition AS part",
            "offset AS off",
            "CAST(CAST(value AS STRING) AS DOUBLE) AS produced",
            f"'{tag}' AS tag",
        )
    )
    target = RealtimeTarget(dsn, "ev", ("part", "off", "produced", "tag"), "probe", "ev")
    _, rows_text, ms_text = (variant + ",100,100").split(",")[:3]
    query = start_realtime(
        frame,
        target,
        checkpoint=tempfile.mkdtemp(prefix="rt-probe-markers-"),
        writer="jvm",
        rows_per_txn=int(rows_text),
        ms_per_txn=int(ms_text),
    )
    with psycopg.connect(dsn, autocommit=True) as conn:
        # One record per partition first, until both are visible: the figures are of
        # records produced while a long batch runs, not of the query's start on a loaded
        # machine. The warm-up records (offset 0) are left out of them.
        warm = Producer({"bootstrap.servers": broker.bootstrap})
        for partition in (0, 1):
            warm.produce(topic, value=repr(time.time()).encode(), partition=partition)
        warm.flush(30)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and query.exception() is None:
            found = conn.execute("SELECT count(*) FROM ev WHERE tag = %s", (tag,)).fetchone()
            if found is not None and found[0] >= 2:
                break
            time.sleep(0.2)
        produce(broker.bootstrap, topic, 2)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and query.exception() is None:
            found = conn.execute("SELECT count(*) FROM ev WHERE tag = %s", (tag,)).fetchone()
            if found is not None and found[0] >= EVENTS + 2:
                break
            time.sleep(0.5)
        lat = conn.execute(
            "SELECT (extract(epoch FROM visible) - produced) * 1000 FROM ev "
            "WHERE tag = %s AND off > 0",
            (tag,),
        ).fetchall()
        per_second = conn.execute(
            "SELECT to_char(date_trunc('second', visible), 'MI:SS'), count(*) FROM ev "
            "WHERE tag = %s AND off > 0 GROUP BY 1 ORDER BY 1",
            (tag,),
        ).fetchall()
    result = percentiles([float(x[0]) for x in lat])
    result["visible_per_second"] = per_second
    error = query.exception()
    result["error"] = str(error)[:2000] if error is not None else None
    query.stop()
    spark.stop()
    return result


def main(argv: list[str]) -> int:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    import psycopg

    from reconcile.demo.embedded_pg import EmbeddedPostgres
    from reconcile.testing.kafka_broker import KafkaBroker

    variants = argv or ["jvm", "append,class,local[2],2", "update,class,local[2],2"]
    if any(v.split(",")[0] in ("jvm", "markers") for v in variants[1:]):
        # spark.jars reaches the driver's classpath only when its JVM starts.
        raise SystemExit(
            "realtime_probe: give jvm or markers first (the JVM starts with the first variant)"
        )
    broker, pg = KafkaBroker(), EmbeddedPostgres()
    try:
        dsn = pg.dsn()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                "CREATE TABLE ev (part int, off bigint, produced double precision, "
                "visible timestamptz DEFAULT clock_timestamp(), tag text)"
            )
        for variant in variants:
            if variant == "jvm":
                found = jvm_variant(broker)
            elif variant.split(",")[0] == "markers":
                found = markers_variant(broker, dsn, variant)
            else:
                found = python_variant(variant, broker, dsn)
            print(json.dumps({"variant": variant, **found}), flush=True)
    finally:
        broker.stop()
        pg.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
