"""The Kafka sink's own topic: a marker per committed epoch, a fence per writer generation.

Every epoch's Kafka transaction writes, beside its rows, one record into the
engine's marker topic (``reconcile_commits`` unless named otherwise): the
pipeline, the sink, the epoch, the writer generation and the progress log. It
commits or aborts with the rows, so a ``read_committed`` consumer that finds
the marker knows the rows are in; that is how a ``commit_transaction`` without
an answer is settled, never guessed. A repair writes a marker that stands for
the epochs it brought the topic to (``first_epoch`` to ``epoch``).

A writer also commits a fence record (its generation) before its first epoch:
a client of an older generation reads it before it initialises its producer
(whose shared ``transactional.id`` would otherwise fence the newer writer's
producer) and is refused.

The topic is compacted with one partition, keyed by pipeline, sink and kind:
what is kept is the newest marker and the newest fence of every sink, which is
all a writer needs, since a sink's epochs commit in order. Records over
``MAX_RECORD_BYTES`` are not the engine's and are refused unread.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from reconcile.core.contract import ConfigurationError, RetryableError

__all__ = ["MAX_RECORD_BYTES", "Marker", "MarkerLog", "MarkerState"]

# A marker or fence record is a few hundred bytes; a larger one was written by
# someone else, and is refused without being decoded.
MAX_RECORD_BYTES = 64 * 1024
_READ_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Marker:
    """A committed epoch (or a repair that stands for several) of one sink."""

    epoch: int
    first_epoch: int
    generation: int
    log_id: str | None
    kind: str  # "commit" or "repair"
    txn: str
    offset: int

    def covers(self, epoch: int) -> bool:
        """Whether the epochs it stands for hold ``epoch``; sink epochs commit in order."""
        return epoch <= self.epoch


@dataclass
class MarkerState:
    """What the marker topic says of one sink: its newest marker and its newest fence."""

    marker: Marker | None = None
    fence_generation: int = 0
    fence_log_id: str | None = None
    end_offset: int = 0
    foreign: list[str] = field(default_factory=list)  # records that are not the engine's


def record_key(pipeline: str, sink: str, kind: str) -> bytes:
    """The marker topic's key of a sink's marker (``commit``) or fence (``fence``)."""
    return f"{pipeline}/{sink}/{kind}".encode()


def _wait_for(admin: Any, topic: str) -> dict[str, Any]:
    """The brokers' topics once ``topic`` is among them (a new topic's metadata takes a moment).

    Raises:
        RetryableError: it did not appear within the read timeout.
    """
    deadline = time.monotonic() + _READ_TIMEOUT_S
    while True:
        topics: dict[str, Any] = admin.list_topics(timeout=_READ_TIMEOUT_S).topics
        if topic in topics and topics[topic].partitions:
            return topics
        if time.monotonic() > deadline:
            raise RetryableError(f"marker topic {topic!r} was created but does not show yet")
        time.sleep(0.05)


class MarkerLog:
    """One sink's view of the marker topic: create it, check it, read it to its end."""

    def __init__(self, client: dict[str, Any], topic: str, pipeline: str, sink: str) -> None:
        self.client, self.topic, self.pipeline, self.sink = client, topic, pipeline, sink

    def ensure(self) -> None:
        """Create the marker topic if it is missing (compacted, one partition); check it.

        Raises:
            ConfigurationError: the topic exists with more than one partition or
                without compaction, naming it.
            RetryableError: the broker cannot be reached.
        """
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient
        from confluent_kafka.admin._config import ConfigResource
        from confluent_kafka.cimpl import NewTopic

        admin = AdminClient(self.client)
        try:
            topics = admin.list_topics(timeout=_READ_TIMEOUT_S).topics
            if self.topic not in topics:
                futures = admin.create_topics(
                    [NewTopic(self.topic, 1, 1, config={"cleanup.policy": "compact"})],
                    operation_timeout=_READ_TIMEOUT_S,
                )
                for future in futures.values():
                    try:
                        future.result(timeout=_READ_TIMEOUT_S)
                    except KafkaException as err:
                        if "TOPIC_ALREADY_EXISTS" not in str(err):
                            raise
                topics = _wait_for(admin, self.topic)
            partitions = len(topics[self.topic].partitions)
            resource = ConfigResource("topic", self.topic)
            config = admin.describe_configs([resource])[resource].result(timeout=_READ_TIMEOUT_S)
        except KafkaException as err:
            raise RetryableError(
                f"kafka sink {self.sink!r}: cannot reach the broker to check marker topic "
                f"{self.topic!r}: {err}"
            ) from None
        policy = config["cleanup.policy"].value if "cleanup.policy" in config else None
        if partitions != 1 or policy != "compact":
            raise ConfigurationError(
                f"kafka sink {self.sink!r}: the engine's marker topic {self.topic!r} has "
                f"{partitions} partitions and cleanup.policy {policy!r}; it must have one "
                "partition and cleanup.policy=compact (the sink creates it so when it is "
                "missing). Delete it or name another marker topic"
            )

    def read(self) -> MarkerState:
        """Read the marker topic to its end (``read_committed``): this sink's newest records.

        Raises:
            RetryableError: the broker cannot be read now.
        """
        from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

        state = MarkerState()
        ours = {
            record_key(self.pipeline, self.sink, "commit"): "commit",
            record_key(self.pipeline, self.sink, "fence"): "fence",
        }
        consumer = Consumer(
            {
                **self.client,
                "group.id": f"reconcile-markers-{self.pipeline}-{self.sink}",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "fetch.message.max.bytes": MAX_RECORD_BYTES,
                # The broker holds an empty fetch up to this long: at the end of
                # the topic, that is the wait before the end is known.
                "fetch.wait.max.ms": 10,
            }
        )
        try:
            partition = TopicPartition(self.topic, 0, 0)
            low, high = consumer.get_watermark_offsets(partition, timeout=_READ_TIMEOUT_S)
            state.end_offset = high
            if high <= low:
                return state
            consumer.assign([TopicPartition(self.topic, 0, low)])
            while True:
                message = consumer.poll(_READ_TIMEOUT_S)
                if message is None:
                    raise RetryableError(
                        f"kafka sink {self.sink!r}: marker topic {self.topic!r} gave nothing "
                        f"for {_READ_TIMEOUT_S:.0f} s before its end"
                    )
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        return state
                    raise KafkaException(error)
                kind = ours.get(message.key() or b"")
                if kind is None:
                    continue  # another sink's records
                self._take(state, kind, message.value(), int(message.offset() or 0))
        except KafkaException as err:
            raise RetryableError(
                f"kafka sink {self.sink!r}: cannot read marker topic {self.topic!r}: {err}"
            ) from None
        finally:
            consumer.close()

    def _take(self, state: MarkerState, kind: str, value: bytes | None, offset: int) -> None:
        where = f"{self.topic}@{offset}"
        if value is None:
            return  # a tombstone: compaction's, or a deletion by hand
        if len(value) > MAX_RECORD_BYTES:
            state.foreign.append(f"{where}: {len(value)} bytes, over the bound")
            return
        try:
            found = json.loads(value)
            if kind == "fence":
                state.fence_generation = max(state.fence_generation, int(found["generation"]))
                state.fence_log_id = found.get("log_id")
                return
            state.marker = Marker(
                epoch=int(found["epoch"]),
                first_epoch=int(found.get("first_epoch", found["epoch"])),
                generation=int(found["generation"]),
                log_id=found.get("log_id"),
                kind=str(found.get("kind", "commit")),
                txn=str(found.get("txn", "")),
                offset=offset,
            )
        except (ValueError, KeyError, TypeError):
            state.foreign.append(f"{where}: not a marker the engine writes")


def marker_value(
    *,
    pipeline: str,
    sink: str,
    epoch: int,
    generation: int,
    log_id: str | None,
    txn: str,
    kind: str = "commit",
    first_epoch: int | None = None,
) -> bytes:
    """A marker record's value."""
    body: dict[str, Any] = {
        "pipeline": pipeline,
        "sink": sink,
        "epoch": epoch,
        "generation": generation,
        "log_id": log_id,
        "txn": txn,
        "kind": kind,
    }
    if first_epoch is not None:
        body["first_epoch"] = first_epoch
    return json.dumps(body, sort_keys=True).encode()


def fence_value(generation: int, log_id: str | None) -> bytes:
    """A fence record's value."""
    return json.dumps({"generation": generation, "log_id": log_id}, sort_keys=True).encode()
