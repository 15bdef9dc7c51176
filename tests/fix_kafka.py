"""Fixture plugin: a throwaway Kafka broker (single-node KRaft) started from its JARs.

The broker is product code (``reconcile.testing.kafka_broker``; the Kafka demo and
benchmark start it too). A test that needs it and cannot get it fails: the JARs
come from ``scripts/setup``, never from the network at test time.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator

import pytest

from reconcile.testing.kafka_broker import KafkaBroker

__all__ = ["KafkaBroker", "create_topic"]

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
