"""The Kafka benchmark's sink part: the Kafka sink against a plain idempotent producer.

The same records (``id``, ``customer``, ``amount``; key ``id``), encoded the
same way (``sinks.kafka.records``), ``epochs`` epochs of ``rows`` each, into a
topic of their own, three ways:

- ``plain_idempotent``: a confluent-kafka producer with ``enable.idempotence``
  (no duplicates from its own retries, but nothing across a restart):
  produce every record, then ``flush`` per epoch;
- ``kafka_sink``: the Kafka sink alone, as the commit cycle drives it (stage,
  prepare, commit: one Kafka transaction per epoch, with its marker record);
- ``engine``: the whole cycle (``CommitCycle.run_epoch``) with the expected
  state on local disk besides: what a pipeline pays per epoch.

Each is timed from the Arrow table to the epoch committed (flushed); rows/s is
the rows of epochs 1 on over the sum of their times (epoch 0 is the warm-up:
the producer's connection, and the sink's ``init_transactions``). The records are checked afterwards
with a ``read_committed`` consumer (the count of each topic), so that a figure
is never that of records that did not arrive.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]

from reconcile.testing.kafka_broker import KafkaBroker

__all__ = ["create_topic", "measure_sink"]


def _rows(first: int, count: int) -> pa.Table:
    ids = list(range(first, first + count))
    return pa.table({"id": ids, "customer": [i % 100 for i in ids],
                     "amount": [float(i % 1000) for i in ids]})  # fmt: skip


def create_topic(broker: KafkaBroker, name: str) -> str:
    """A one-partition topic ``name`` on ``broker``."""
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.cimpl import NewTopic

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for future in admin.create_topics([NewTopic(name, 1, 1)], operation_timeout=30).values():
        future.result(timeout=60)
    return name


def _count(broker: KafkaBroker, topic: str) -> int:
    """The records of ``topic`` a ``read_committed`` consumer sees (markers aside)."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"count-{topic}",
                         "isolation.level": "read_committed", "enable.auto.commit": False,
                         "enable.partition.eof": True})  # fmt: skip
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        seen = 0
        while True:
            batch = consumer.consume(10_000, timeout=30)
            if not batch:
                raise RuntimeError(f"no end of {topic} within 30 s")
            for message in batch:
                error = message.error()
                if error is None:
                    seen += 1
                elif error.code() == KafkaError._PARTITION_EOF:
                    return seen
                else:
                    raise RuntimeError(f"{topic}: {error}")
    finally:
        consumer.close()


def _plain(broker: KafkaBroker, topic: str, epochs: int, rows: int) -> float:
    from confluent_kafka import Producer

    from sinks.kafka.records import encode_key, encode_value

    producer = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True})
    took = 0.0
    for epoch in range(epochs):
        table = _rows(epoch * rows, rows)
        began = time.perf_counter()
        for row in table.to_pylist():
            while True:
                try:
                    producer.produce(topic, key=encode_key(row, ["id"], topic),
                                     value=encode_value(row, topic))  # fmt: skip
                    break
                except BufferError:  # the local queue is full: let it drain
                    producer.poll(0.05)
            producer.poll(0)
        if producer.flush(60):
            raise RuntimeError(f"{topic}: records left unsent")
        took += (time.perf_counter() - began) if epoch else 0.0  # epoch 0: the warm-up
    return took


def _sink(broker: KafkaBroker, topic: str, epochs: int, rows: int, *, cycle: bool) -> float:
    from reconcile import CommitCycle, CommitSucceeded
    from reconcile.core.contract import OK, SinkTxnId, WriterIdentity
    from reconcile.core.sink import bind_writer
    from reconcile.engine.expected import ExpectedState
    from sinks.kafka.sink import KafkaSink

    sink = KafkaSink(broker.bootstrap, topic, name="out", key=["id"],
                     marker_topic=f"{topic}-markers", transactional_prefix=topic)  # fmt: skip
    took = 0.0
    with tempfile.TemporaryDirectory(prefix="reconcile-bench-kafka-sink-") as store:
        runner: Any = None
        if cycle:
            expected = ExpectedState(store, "bench", {"out": ["id"]})
            runner = CommitCycle("bench", [sink], expected_state=expected)
            runner.start()
        else:
            bind_writer(sink, WriterIdentity("bench", "bench-log"))
        try:
            for epoch in range(epochs):
                table = _rows(epoch * rows, rows)
                began = time.perf_counter()
                if runner is not None:
                    outcome = runner.run_epoch(epoch, {"out": table})
                    if outcome != CommitSucceeded(epoch):
                        raise RuntimeError(f"{topic}: epoch {epoch} gave {outcome!r}")
                else:
                    txn = SinkTxnId("bench", "out", epoch, 1)
                    got = sink.stage(txn, table)
                    got = sink.prepare(txn) if got == OK else got
                    got = sink.commit(txn) if got == OK else got
                    if got != OK:
                        raise RuntimeError(f"{topic}: epoch {epoch} gave {got!r}")
                # Epoch 0 is the warm-up: a transactional producer's first epoch also
                # initialises it (init_transactions, the marker topic read to its end).
                took += (time.perf_counter() - began) if epoch else 0.0
        finally:
            if runner is not None:
                runner.close()
            else:
                sink.close()
    return took


def measure_sink(broker: KafkaBroker, epochs: int, rows: int) -> dict[str, Any]:
    """Rows/s of the three ways, each checked by counting its topic's committed records."""
    total = epochs * rows
    figures: dict[str, Any] = {"epochs": epochs, "rows_per_epoch": rows}
    ways: dict[str, Callable[[str], float]] = {
        "plain_idempotent": lambda t: _plain(broker, t, epochs, rows),
        "kafka_sink": lambda t: _sink(broker, t, epochs, rows, cycle=False),
        "engine": lambda t: _sink(broker, t, epochs, rows, cycle=True),
    }
    for name, way in ways.items():
        print(f"sink part: {name}, {epochs} x {rows} records ...", flush=True)
        topic = create_topic(broker, f"sink-{name.replace('_', '-')}")
        seconds = way(topic)
        arrived = _count(broker, topic)
        if arrived != total:
            raise RuntimeError(f"{name}: {arrived} records of {total} in {topic}")
        timed = total - rows  # epoch 0 is the warm-up
        figures[name] = {"rows_per_s": round(timed / seconds), "seconds": round(seconds, 3)}
    plain = figures["plain_idempotent"]["rows_per_s"]
    for name in ("kafka_sink", "engine"):
        figures[name]["vs_plain"] = round(figures[name]["rows_per_s"] / plain, 3)
    return figures
