"""The demo fed through Kafka (``reconcile demo --source kafka``): a broker, a feed, a stream.

The supervisor starts a single-node broker from the JARs ``scripts/setup``
cached (``reconcile.testing.kafka_broker``, nothing is downloaded) and feeds
each lineitem slice into one topic as JSON records, one slice per interval,
with an idempotent producer: the broker keeps each record once even when the
client retries a send. The pipeline process reads the topic with Spark's
Kafka connector (``startingOffsets`` earliest, so the first run reads every
slice; a restart resumes from the offsets in Spark's checkpoint), and the
engine records each epoch's offset ranges in the store beside its rows.

A slice's record of having been produced is a file under ``kafka-fed/``
whose modification time is the slice's event time, as a dropped file's is
in the files demo: the feeder, the summary and the latency figures read it
the same way.

The broker lives as long as the run: a demo killed whole cannot resume a
Kafka-fed run (its topic is gone), so ``--source kafka`` with the work folder
of an earlier run is refused.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow.compute as pc  # type: ignore[import-untyped, unused-ignore]

from reconcile.core.contract import ConfigurationError
from reconcile.demo.tpch.data import LINEITEM_COLUMNS, Feed

__all__ = ["ENV", "SOURCES", "TOPIC", "KafkaFeed", "feed_source", "lineitem_rows", "lines_stream"]

SOURCES = ("files", "kafka")
ENV = "RECONCILE_DEMO_KAFKA"  # BOOTSTRAP|TOPIC|RECORDS_PER_BATCH, for the pipeline process
TOPIC = "demo_lineitem_in"


def _json(value: Any) -> Any:
    # Decimals and dates as text: the Spark side casts each column to its type,
    # so no value passes through a binary float on the way.
    if isinstance(value, Decimal | dt.date):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON")


class KafkaFeed(Feed):
    """The files demo's slices, produced into ``topic`` instead of dropped as files."""

    def __init__(self, tpch: Path, workdir: Path, epochs: int, bootstrap: str) -> None:
        super().__init__(tpch, workdir / "inbox", epochs)
        self.fed = workdir / "kafka-fed"
        self.fed.mkdir(parents=True, exist_ok=True)
        self.bootstrap = bootstrap

    def path(self, index: int) -> Path:
        """The slice's record of having been produced (its mtime: the event time)."""
        return self.fed / f"lineitem-{index:06d}"

    def write_ahead(self, indices: list[int]) -> None:
        """Nothing to write ahead: a slice goes into the topic when it is dropped."""

    def drop(self, index: int) -> float:
        """Produce slice ``index`` into the topic (once); its event time.

        Raises:
            RuntimeError: the broker refused a record (naming the topic and the error).
        """
        target = self.path(index)
        if target.exists():
            return target.stat().st_mtime
        from confluent_kafka import Producer

        part = self.slices[index]
        column = self.lineitem.column("l_orderkey")
        rows = self.lineitem.filter(
            pc.and_(pc.greater_equal(column, part.lo), pc.less(column, part.hi))
        )
        target.touch()  # the event time is the start of the produce, as a drop's
        failed: list[str] = []

        def delivered(err: Any, _message: Any) -> None:
            if err is not None:
                failed.append(str(err))

        producer = Producer(
            {"bootstrap.servers": self.bootstrap, "enable.idempotence": True, "linger.ms": 20}
        )
        for row in rows.to_pylist():
            key = f"{row['l_orderkey']}:{row['l_linenumber']}".encode()
            value = json.dumps(row, default=_json).encode()
            while True:
                try:
                    producer.produce(TOPIC, key=key, value=value, on_delivery=delivered)
                    break
                except BufferError:  # the client's queue is full: let it send
                    producer.poll(0.1)
        left = producer.flush(60)
        if failed or left:
            target.unlink(missing_ok=True)
            raise RuntimeError(
                f"kafka topic {TOPIC!r}: slice {index} was not produced whole "
                f"({left} records unsent; {failed[:3]})"
            )
        return target.stat().st_mtime


@contextlib.contextmanager
def feed_source(
    source: str, tpch: Path, workdir: Path, epochs: int, resumed: bool
) -> Iterator[tuple[Feed, dict[str, str]]]:
    """The run's feed, and what the pipeline process's environment must add to read it.

    For ``kafka``, a broker with the demo's topic, for the run only.

    Raises:
        ConfigurationError: an unknown source; for ``kafka``, the work folder
            holds an earlier run (its topic died with its broker), or the
            broker's JARs are not cached.
    """
    if source not in SOURCES:
        raise ConfigurationError(f"--source must be one of {', '.join(SOURCES)}, got {source!r}")
    if source == "files":
        yield Feed(tpch, workdir / "inbox", epochs), {}
        return
    if resumed:
        raise ConfigurationError(
            f"--source kafka cannot resume the run in {workdir}: its broker and topic lived "
            "only as long as that run. Use a new --workdir"
        )
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.cimpl import NewTopic

    from reconcile.testing.kafka_broker import KafkaBroker

    broker = KafkaBroker()
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        for future in admin.create_topics([NewTopic(TOPIC, 2, 1)]).values():
            future.result(timeout=60)
        feed = KafkaFeed(tpch, workdir, epochs, broker.bootstrap)
        # At most a slice a micro-batch, as the files demo reads a file a batch: a
        # pipeline that starts late would otherwise take every slice in one epoch.
        per_batch = max(part.rows for part in feed.slices)
        yield feed, {ENV: f"{broker.bootstrap}|{TOPIC}|{per_batch}"}
    finally:
        broker.stop()


def lines_stream(spark: Any, workdir: Path) -> Any:
    """The stream of lineitem rows: the topic named in ``ENV`` if set, else the inbox's files."""
    from reconcile.demo.tpch.data import LINEITEM_SPARK_SCHEMA

    source = os.environ.get(ENV)
    if not source:
        return (
            spark.readStream.schema(LINEITEM_SPARK_SCHEMA)
            .option("maxFilesPerTrigger", 1)
            .parquet(str(workdir / "inbox"))
        )
    bootstrap, topic, per_batch = source.split("|", 2)
    records = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", per_batch)
        .option("failOnDataLoss", "true")
        .load()
    )
    return lineitem_rows(records)


def lineitem_rows(records: Any, keep: tuple[str, ...] = ()) -> Any:
    """The Kafka source's records as lineitem rows (each column cast to its type), and ``keep``."""
    from pyspark.sql import functions as F

    as_text = ", ".join(f"{name} string" for name, _, _ in LINEITEM_COLUMNS)
    parsed = records.select(*keep, F.from_json(F.col("value").cast("string"), as_text).alias("r"))
    return parsed.select(
        *keep,
        *(
            F.col(f"r.{name}").cast(spark_type).alias(name)
            for name, spark_type, _ in LINEITEM_COLUMNS
        ),
    )
