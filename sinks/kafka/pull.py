"""Reading a Kafka topic used as a table to its end: the last record of every key, and who wrote it.

A compacted topic is a table: a key's newest record is its row, a tombstone
(a record with a null value) its removal. A pull reads the topic's partitions
with ``read_committed`` up to the ends they had when the pull began (records
committed later are the next pull's), and folds them in offset order.

A record without the engine's headers was produced by someone else: it still
counts as what the topic holds (a consumer sees it), and the pull counts it.
For each key it keeps where its row came from (:class:`Origin`): the sink txn
id of the engine's record, else the partition and offset of another
producer's. Kafka does not tell a consumer which producer or transaction
wrote a record, so each foreign record is a write of its own.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from reconcile.core.contract import (
    ConfigurationError,
    InvalidInputError,
    RetryableError,
    SinkTxnId,
    TxnIdParseError,
)
from reconcile.core.target import Progress

from .records import EPOCH_HEADER, TXN_HEADER, decode_key, decode_value
from .records import header as header_of

__all__ = ["Origin", "Pulled", "pull_topic"]

_TIMEOUT_S = 60.0
_PROGRESS_EVERY = 65_536


@dataclass(frozen=True)
class Origin:
    """Where a key's row came from: its record's writer and its time.

    ``txn`` is the engine's sink txn id (``reconcile.txn`` header) or None for
    a record without it; ``partition`` and ``offset`` place the record;
    ``timestamp_ms`` is the record's timestamp (None when it has none).
    """

    txn: str | None
    partition: int
    offset: int
    timestamp_ms: int | None

    def written_by(self, pipeline: str, sink: str) -> bool:
        """Whether the engine wrote it for ``pipeline``'s ``sink`` (its txn id says so)."""
        if self.txn is None:
            return False
        try:
            txn = SinkTxnId.from_string(self.txn)
        except TxnIdParseError:
            return False  # a header the engine would never write: not the engine's
        return txn.pipeline == pipeline and txn.sink == sink

    @property
    def writer(self) -> str:
        """The transaction, as the report shows it: the txn id, else the record's place."""
        return self.txn or f"partition {self.partition} offset {self.offset}"

    @property
    def committed_at(self) -> dt.datetime | None:
        if self.timestamp_ms is None or self.timestamp_ms < 0:
            return None
        return dt.datetime.fromtimestamp(self.timestamp_ms / 1000, tz=dt.UTC)


class Pulled:
    """A topic folded to its rows: key -> row, epoch of its record, origin; foreign records."""

    def __init__(self) -> None:
        self.rows: dict[bytes, dict[str, Any]] = {}
        self.epochs: dict[bytes, int | None] = {}
        self.origins: dict[bytes, Origin] = {}
        self.foreign = 0
        self.records = 0


def pull_topic(
    client: dict[str, Any],
    topic: str,
    keys: Sequence[str],
    progress: Progress | None = None,
) -> Pulled:
    """Fold every committed record of ``topic`` up to its current end into rows.

    Raises:
        ConfigurationError: the topic does not exist.
        RetryableError: the brokers cannot be read.
        InvalidInputError: a record whose key or value is not a row of the table,
            naming the topic, partition and offset.
    """
    from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

    pulled = Pulled()
    consumer = Consumer(
        {
            **client,
            "group.id": f"reconcile-pull-{uuid.uuid4().hex}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "fetch.wait.max.ms": 10,  # the end of a partition is known without waiting
        }
    )
    try:
        metadata = consumer.list_topics(topic, timeout=_TIMEOUT_S).topics.get(topic)
        if metadata is None or metadata.error is not None:
            raise ConfigurationError(f"kafka topic {topic!r} does not exist")
        ends: dict[int, int] = {}
        for partition in metadata.partitions:
            low, high = consumer.get_watermark_offsets(
                TopicPartition(topic, partition, 0), timeout=_TIMEOUT_S
            )
            if high > low:
                ends[partition] = high
        consumer.assign([TopicPartition(topic, p, 0) for p in ends])
        pending = set(ends)
        while pending:
            message = consumer.poll(_TIMEOUT_S)
            if message is None:
                raise RetryableError(f"kafka topic {topic!r}: nothing read for {_TIMEOUT_S:.0f} s")
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    pending.discard(int(message.partition() or 0))
                    continue
                raise KafkaException(error)
            partition, offset = int(message.partition() or 0), int(message.offset() or 0)
            if offset >= ends.get(partition, 0):
                pending.discard(partition)  # committed after the pull began: the next pull's
                continue
            _fold(pulled, message, keys, topic)
            if progress is not None and pulled.records % _PROGRESS_EVERY == 0:
                progress(len(pulled.rows), None)
    except KafkaException as err:
        raise RetryableError(f"kafka topic {topic!r}: cannot be read: {err}") from None
    finally:
        consumer.close()
    return pulled


def _fold(pulled: Pulled, message: Any, keys: Sequence[str], topic: str) -> None:
    pulled.records += 1
    key = message.key()
    where = f"kafka topic {topic!r} partition {message.partition()} offset {message.offset()}"
    if key is None:
        raise InvalidInputError(f"{where}: a record without a key: not a row of a table")
    try:
        decode_key(key, keys)
        value = message.value()
        row = None if value is None else decode_value(value)
        epoch_text = header_of(message.headers(), EPOCH_HEADER)
        epoch = None if epoch_text is None else int(epoch_text)
    except ValueError as err:
        raise InvalidInputError(f"{where}: {err}") from None
    txn = header_of(message.headers(), TXN_HEADER)
    if txn is None:
        pulled.foreign += 1
    if row is None:
        pulled.rows.pop(key, None)
        pulled.epochs.pop(key, None)
        pulled.origins.pop(key, None)
        return
    pulled.rows[key] = row
    pulled.epochs[key] = epoch
    kind, timestamp = message.timestamp()
    # TIMESTAMP_NOT_AVAILABLE is 0: a record that carries no time.
    pulled.origins[key] = Origin(txn, int(message.partition() or 0), int(message.offset() or 0),
                                 int(timestamp) if kind else None)  # fmt: skip
