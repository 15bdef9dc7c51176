"""The rebuild's replay of a Kafka-fed stream: each epoch's offsets, from the store, read again.

A real stream reads a real topic through Spark's Kafka connector and writes
through ``write_stream`` with an expected state, which records each epoch's
offset ranges. The replay then calls another app on each micro-batch's exact
offsets (the later micro-batch's row of a key wins, the epochs after the one
asked for are left out); once the topic's retention dropped records an epoch
read, it is refused, naming the topic, the partition, the offsets and the epoch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from expected_state.source_offsets import SourceOffsets
from reconcile import CommitCycle
from reconcile.core.contract import ConfigurationError
from reconcile.engine.expected import ExpectedState
from reconcile.spark.replay import replay
from reconcile.spark.stream import write_stream
from reconcile.testing.kafka_broker import KafkaBroker
from sinks.memory.sink import MemorySink, MemoryStore
from tests.fix_kafka import create_topic

pytestmark = pytest.mark.integration

VALUE = "id long, qty long"
# Four micro-batches of two records: key 1 is written by 0, 1 and 3.
RECORDS = [(1, 1), (2, 2), (1, 10), (3, 3), (2, 20), (4, 4), (1, 100), (5, 5)]


def _app(bootstrap: str, topic: str, factor: int = 1) -> Any:
    def app(session: Any) -> tuple[Any, Any]:
        from pyspark.sql import functions as F

        frame = (
            session.readStream.format("kafka")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", topic)
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", 2)
            .load()
            .select(F.from_json(F.col("value").cast("string"), VALUE).alias("v"))
            .select("v.*")
            .withColumn("qty", F.col("qty") * factor)
        )
        return frame, None

    return app


@pytest.fixture
def streamed(spark: Any, kafka_broker: KafkaBroker, tmp_path: Path) -> tuple[str, Path]:
    topic = create_topic(kafka_broker, "replay")
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap})
    for i, qty in RECORDS:
        producer.produce(topic, value=json.dumps({"id": i, "qty": qty}).encode())
    assert producer.flush(30) == 0
    store = MemoryStore()

    def build() -> CommitCycle:
        expected = ExpectedState(str(tmp_path / "store"), "shop", {"out": ["id"]})
        return CommitCycle("shop", [MemorySink("out", store)], expected_state=expected)

    frame, _ = _app(kafka_broker.bootstrap, topic)(spark)
    query = write_stream(
        frame,
        build,
        checkpoint=str(tmp_path / "checkpoint"),
        staging=str(tmp_path / "staging"),
        trigger={"availableNow": True},
    )
    query.awaitTermination()
    query.reconcile_writer.close()
    return topic, tmp_path


def test_each_epoch_s_offsets_are_recorded_and_replayed_under_new_logic(
    spark: Any, kafka_broker: KafkaBroker, streamed: tuple[str, Path]
) -> None:
    topic, root = streamed
    ranges = SourceOffsets(str(root / "store"), "shop").ranges(through=10)
    assert {e: [(r.from_offset, r.to_offset) for r in rs] for e, rs in ranges.items()} == {
        0: [(0, 2)],
        1: [(2, 4)],
        2: [(4, 6)],
        3: [(6, 8)],
    }
    app = _app(kafka_broker.bootstrap, topic, factor=2)
    tables = {"out": (["id"], ["id", "qty"])}
    state = replay(spark, app, str(root / "checkpoint"), 2, tables,
                   store=(str(root / "store"), "shop"))  # fmt: skip
    got = {r["id"]: r["qty"] for r in state["out"].to_pylist()}
    assert got == {1: 20, 2: 40, 3: 6, 4: 8}  # epoch 3 left out; key 1's later row wins


def test_a_topic_whose_retention_dropped_an_epoch_s_records_is_refused_and_offsets_asked_for(
    spark: Any, kafka_broker: KafkaBroker, streamed: tuple[str, Path]
) -> None:
    topic, root = streamed
    app = _app(kafka_broker.bootstrap, topic)
    # Under another store, no epoch has offsets: the retained input is asked for.
    with pytest.raises(ConfigurationError, match=r"no source offsets of epochs \[0, 1, 2\]"):
        replay(spark, app, str(root / "checkpoint"), 2, {"out": (["id"], ["id", "qty"])},
               store=(str(root / "other-store"), "shop"))  # fmt: skip
    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap})
    for future in admin.delete_records([TopicPartition(topic, 0, 3)]).values():
        future.result(timeout=30)
    with pytest.raises(ConfigurationError) as refused:
        replay(spark, app, str(root / "checkpoint"), 3, {"out": (["id"], ["id", "qty"])},
               store=(str(root / "store"), "shop"))  # fmt: skip
    message = str(refused.value)
    assert f"topic {topic!r} partition 0 now starts at offset 3" in message
    assert "dropped offsets 0 to 2, which epoch 0 read" in message
    assert "rebuild_input" in message
