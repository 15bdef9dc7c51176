"""The Kafka broker the tests run is a real one: transactions, read_committed, fencing, restarts.

What the Kafka source and sink rely on, checked on the broker itself: an aborted
transaction is never seen by a ``read_committed`` consumer, a second producer
with the same ``transactional.id`` fences the first (the broker refuses it), and
a broker killed with SIGKILL comes back with every committed record.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer

from reconcile.testing.kafka_broker import KafkaBroker
from tests.fix_kafka import create_topic

pytestmark = pytest.mark.integration


def producer(broker: KafkaBroker, txn_id: str) -> Producer:
    p = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": txn_id})
    p.init_transactions(60)
    return p


def read_committed(broker: KafkaBroker, topic: str) -> list[tuple[bytes | None, bytes | None]]:
    """Every committed record of ``topic``'s partition 0, read to its end."""
    from confluent_kafka import TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": f"check-{topic}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        found: list[tuple[bytes | None, bytes | None]] = []
        while True:
            message = consumer.poll(30)
            assert message is not None, "no end of partition within 30 s"
            error: Any = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    return found
                raise KafkaException(error)
            found.append((message.key(), message.value()))
    finally:
        consumer.close()


def test_read_committed_sees_committed_records_only(
    kafka_broker: KafkaBroker, kafka_topic: Callable[..., str]
) -> None:
    topic = kafka_topic()
    p = producer(kafka_broker, f"{topic}-writer")
    p.begin_transaction()
    p.produce(topic, key=b"a", value=b"1")
    p.commit_transaction(60)
    p.begin_transaction()
    p.produce(topic, key=b"b", value=b"lost")
    p.flush(30)
    p.abort_transaction(60)
    assert read_committed(kafka_broker, topic) == [(b"a", b"1")]


def test_a_new_producer_with_the_same_transactional_id_fences_the_old_one(
    kafka_broker: KafkaBroker, kafka_topic: Callable[..., str]
) -> None:
    topic = kafka_topic()
    zombie = producer(kafka_broker, f"{topic}-writer")
    zombie.begin_transaction()
    zombie.produce(topic, key=b"z", value=b"late")
    zombie.flush(30)
    newer = producer(kafka_broker, f"{topic}-writer")  # init_transactions fences the zombie
    with pytest.raises(KafkaException) as raised:
        zombie.commit_transaction(60)
    assert raised.value.args[0].fatal() or raised.value.args[0].txn_requires_abort()
    newer.begin_transaction()
    newer.produce(topic, key=b"n", value=b"1")
    newer.commit_transaction(60)
    assert read_committed(kafka_broker, topic) == [(b"n", b"1")]


@pytest.mark.slow
def test_a_killed_broker_comes_back_with_every_committed_record() -> None:
    with KafkaBroker() as broker:
        topic = create_topic(broker)
        p = producer(broker, "w")
        p.begin_transaction()
        p.produce(topic, key=b"k", value=b"v")
        p.commit_transaction(60)
        broker.kill9()
        broker.start()
        assert read_committed(broker, topic) == [(b"k", b"v")]
