"""A Kafka-fed stream's micro-batches read again, from the offsets the store recorded.

The streaming writer records each epoch's offset ranges in the store before the
epoch is decided (``expected_state.source_offsets``). A rebuild reads them, and
each micro-batch's ``readStream.format("kafka")`` of the app becomes a batch
read of exactly those offsets (``startingOffsets`` / ``endingOffsets``). The
records must still be in the topic: before anything is read, each partition's
earliest offset is compared with the oldest offset the replay needs, and a
topic whose retention dropped some is refused, naming the topic, the partition,
the offsets lost and the epoch that read them. Only then is retained input
(``run.rebuild_input``) the way to rebuild.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from expected_state.source_offsets import OffsetRange, SourceOffsets
from reconcile.core.contract import ConfigurationError

__all__ = ["check_retained", "kafka_batches", "kafka_read"]

# Options of a streaming Kafka source that a batch read does not take (or that
# the replay sets itself).
_STREAM_ONLY = frozenset(
    {"startingoffsets", "endingoffsets", "maxoffsetspertrigger", "minoffsetspertrigger",
     "maxtriggerdelay", "startingoffsetsbytimestamp", "startingtimestamp",
     "startingoffsetsbytimestampstrategy", "endingoffsetsbytimestamp", "endingtimestamp"}
)  # fmt: skip


def kafka_batches(store: str, pipeline: str, through: int) -> dict[int, list[OffsetRange]]:
    """Epoch -> its offset ranges, for every epoch up to ``through``, from the store.

    Raises:
        ConfigurationError: an epoch up to ``through`` has none recorded (it ran
            before offsets were recorded, or under another store).
    """
    batches = SourceOffsets(store, pipeline).ranges(through)
    missing = sorted(set(range(through + 1)) - set(batches))
    if missing:
        shown = missing if len(missing) <= 10 else [*missing[:10], "..."]
        raise ConfigurationError(
            f"pipeline {pipeline!r}: the store holds no source offsets of epochs {shown}, "
            f"which a rebuild to epoch {through} replays (they ran before the writer recorded "
            "offsets, or under another store): name the retained input in the run table's "
            "rebuild_input"
        )
    return batches


def check_retained(
    bootstrap: str, batches: Mapping[int, Sequence[OffsetRange]], client: Mapping[str, Any]
) -> None:
    """Refuse a replay whose records retention dropped from the topic, naming what is lost.

    Raises:
        ConfigurationError: a partition's earliest offset is past an offset an
            epoch read (topic, partition, the offsets lost, the epoch).
    """
    from confluent_kafka import Consumer, TopicPartition

    needed: dict[tuple[str, int], tuple[int, int]] = {}  # (topic, partition) -> (offset, epoch)
    for epoch, ranges in sorted(batches.items()):
        for r in ranges:
            if r.to_offset > r.from_offset and (r.topic, r.partition) not in needed:
                needed[(r.topic, r.partition)] = (r.from_offset, epoch)
    consumer = Consumer({**client, "bootstrap.servers": bootstrap,
                         "group.id": "reconcile-rebuild-check"})  # fmt: skip
    try:
        for (topic, partition), (offset, epoch) in sorted(needed.items()):
            low, _ = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=30)
            if low > offset:
                raise ConfigurationError(
                    f"topic {topic!r} partition {partition} now starts at offset {low}: its "
                    f"retention dropped offsets {offset} to {low - 1}, which epoch {epoch} read, "
                    "so the stream cannot be replayed from the topic. Name the retained input "
                    "in the run table's rebuild_input to rebuild"
                )
    finally:
        consumer.close()


def _offsets_json(ranges: Sequence[OffsetRange], end: bool) -> str:
    found: dict[str, dict[str, int]] = {}
    for r in ranges:
        found.setdefault(r.topic, {})[str(r.partition)] = r.to_offset if end else r.from_offset
    return json.dumps(found, sort_keys=True)


def kafka_read(spark: Any, options: Mapping[str, Any], ranges: Sequence[OffsetRange]) -> Any:
    """The app's Kafka source as a batch read of exactly ``ranges``.

    Raises:
        ConfigurationError: the app named no ``kafka.bootstrap.servers``.
    """
    kept = {k: v for k, v in options.items() if k.lower() not in _STREAM_ONLY}
    bootstrap = kept.get("kafka.bootstrap.servers")
    if not bootstrap:
        raise ConfigurationError("the app's Kafka source names no kafka.bootstrap.servers")
    reader = spark.read.format("kafka").options(**kept)
    if not ranges:
        # A micro-batch that read nothing: an empty read of the same columns.
        return reader.option("startingOffsets", "latest").option("endingOffsets", "latest").load()
    return (
        reader.option("startingOffsets", _offsets_json(ranges, end=False))
        .option("endingOffsets", _offsets_json(ranges, end=True))
        .load()
    )
