"""Fixture plugin: a throwaway Kafka broker (single-node KRaft) started from its JARs.

The broker is product code (``reconcile.testing.kafka_broker``; the Kafka demo and
benchmark start it too). A test that needs it and cannot get it fails: the JARs
come from ``scripts/setup``, never from the network at test time.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from reconcile.testing.kafka_broker import KafkaBroker

__all__ = ["KafkaBroker", "KafkaHarness", "create_topic", "read_topic"]

_topics = itertools.count()


def create_topic(broker: KafkaBroker, prefix: str = "t", partitions: int = 1, **config: str) -> str:
    """A new topic on ``broker`` with a name of its own; its name."""
    from confluent_kafka.admin import AdminClient, NewTopic

    name = f"{prefix}-{next(_topics)}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for future in admin.create_topics(
        [NewTopic(name, partitions, 1, config=dict(config))], operation_timeout=30
    ).values():
        future.result(timeout=60)
    return name


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[KafkaBroker]:
    """The session's shared broker. Never skipped."""
    broker = KafkaBroker()
    yield broker
    broker.stop()


@pytest.fixture
def kafka_topic(kafka_broker: KafkaBroker) -> Callable[..., str]:
    """Make fresh topics on the shared broker: ``kafka_topic(prefix, partitions, **config)``."""

    def make(prefix: str = "t", partitions: int = 1, **config: str) -> str:
        return create_topic(kafka_broker, prefix, partitions, **config)

    return make


def read_topic(
    broker: KafkaBroker | str, topic: str, *, committed: bool = True
) -> list[tuple[bytes | None, bytes | None, dict[str, str]]]:
    """Every record of ``topic``'s partition 0, read to its end: key, value, headers.

    ``committed``: with ``read_committed`` (what a consumer of the pipeline's
    output sees); else ``read_uncommitted`` (what is in the log at all).
    """
    from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

    bootstrap = broker if isinstance(broker, str) else broker.bootstrap
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"check-{topic}",
            "isolation.level": "read_committed" if committed else "read_uncommitted",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "fetch.wait.max.ms": 10,  # the end of a partition is known without waiting
        }
    )
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        found = []
        while True:
            message = consumer.poll(30)
            assert message is not None, f"no end of {topic} within 30 s"
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    return found
                raise KafkaException(error)
            headers = {k: (v or b"").decode() for k, v in message.headers() or ()}
            found.append((message.key(), message.value(), headers))
    finally:
        consumer.close()


class KafkaHarness:
    """Kafka sinks on one topic, with a marker topic and a transactional.id prefix of their own.

    ``target``: ``BOOTSTRAP|TOPIC`` (what a kill test's subprocess is given).
    """

    kind = "kafka"

    def __init__(self, target: str) -> None:
        self.bootstrap, self.topic = target.split("|")
        self.marker_topic = f"{self.topic}-markers"
        self.prefix = f"p-{self.topic}"

    @classmethod
    def on(cls, broker: KafkaBroker) -> KafkaHarness:
        """A harness on a new topic of ``broker``."""
        return cls(f"{broker.bootstrap}|{create_topic(broker, 'sink')}")

    def new_sink(self, name: str) -> Any:
        from sinks.kafka.sink import KafkaSink

        return KafkaSink(
            self.bootstrap,
            self.topic,
            name=name,
            key=["k"],
            marker_topic=self.marker_topic,
            transactional_prefix=self.prefix,
        )

    def committed(self, name: str) -> dict[int, list[dict[str, Any]]]:
        from reconcile.core.contract import SinkTxnId
        from sinks.kafka.records import TXN_HEADER, decode_value

        found: dict[int, list[dict[str, Any]]] = {}
        for _, value, headers in read_topic(self.bootstrap, self.topic):
            txn = SinkTxnId.from_string(headers[TXN_HEADER])
            if txn.sink == name and value is not None:
                found.setdefault(txn.epoch, []).append(decode_value(value))
        return found

    def prepared(self, name: str) -> list[Any]:
        return []  # a producer's open transaction dies with it: nothing outlives the client


@pytest.fixture
def kafka_harness(kafka_broker: KafkaBroker) -> KafkaHarness:
    return KafkaHarness.on(kafka_broker)
