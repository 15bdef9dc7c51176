"""The Kafka sink end to end on a real broker: the cycle, verify and repair of a compacted topic.

Rows go through ``CommitCycle`` with an expected-state store into a compacted
topic; another producer then changes the topic (a value, a tombstone, a new
key, all without the engine's headers). ``recover`` counts exactly that drift
and repairs it in one Kafka transaction with its marker; a second run writes
nothing. Everything is checked with a ``read_committed`` consumer of the topic.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import Producer

from reconcile import CommitCycle, CommitFatal, CommitSucceeded, recover
from reconcile.core.contract import OK, Change, ConfigurationError, SinkTxnId
from reconcile.core.errors import UntrustedRecordError
from reconcile.core.target import Repair
from reconcile.engine.expected import ExpectedState
from reconcile.testing.kafka_broker import KafkaBroker
from sinks.kafka.markers import MarkerLog, fence_value, marker_value, record_key
from sinks.kafka.records import decode_key, decode_value, encode_key, encode_value
from sinks.kafka.recovery import REPAIR_HEADER
from sinks.kafka.sink import KafkaSink
from tests.fix_kafka import read_topic

pytestmark = pytest.mark.integration


def table_of(broker: KafkaBroker, topic: str) -> dict[tuple[Any, ...], dict[str, Any]]:
    """What a read_committed consumer holds as a table: the last value per key."""
    rows: dict[tuple[Any, ...], dict[str, Any]] = {}
    for key, value, _ in read_topic(broker, topic):
        assert key is not None
        k = tuple(decode_key(key, ["id"]).values())
        if value is None:
            rows.pop(k, None)
        else:
            rows[k] = decode_value(value)
    return rows


def write_epochs(broker: KafkaBroker, topic: str, root: Path, epochs: int) -> None:
    expected = ExpectedState(str(root), "shop", {"orders": ["id"]})
    sink = KafkaSink(broker.bootstrap, topic, name="orders", key=["id"],
                     marker_topic=f"{topic}-markers", transactional_prefix=topic)  # fmt: skip
    cycle = CommitCycle("shop", [sink], expected_state=expected)
    cycle.start()
    try:
        for e in range(epochs):
            rows: list[Any] = [
                {"id": i, "name": f"n{i}", "total": 10 * i + e} for i in range(e * 5, e * 5 + 8)
            ]
            if e:
                rows.append(Change("delete", {"id": e * 5 - 5}))
            assert cycle.run_epoch(e, {"orders": rows}) == CommitSucceeded(e)
    finally:
        cycle.close()


def test_cycle_writes_each_epoch_once_and_verify_repair_undo_a_foreign_producer(
    kafka_broker: KafkaBroker, kafka_topic: Callable[..., str], tmp_path: Path
) -> None:
    topic = kafka_topic("orders", **{"cleanup.policy": "compact"})
    write_epochs(kafka_broker, topic, tmp_path, 3)
    store = str(tmp_path)
    dsn = f"kafka://{kafka_broker.bootstrap}?marker_topic={topic}-markers"
    want = table_of(kafka_broker, topic)
    assert sorted(want) == [(i,) for i in range(18) if i not in (0, 5)]
    options: dict[str, Any] = {"mode": "full", "sink": "orders", "keys": ["id"]}
    clean = recover(dsn, store, "shop", topic, dry_run=True, **options)
    assert (clean.missing, clean.extra, clean.changed) == (0, 0, 0)

    foreign = Producer({"bootstrap.servers": kafka_broker.bootstrap})
    for row in ({"id": 3, "name": "hand", "total": 0}, {"id": 999, "name": "x", "total": 1}):
        foreign.produce(topic, key=encode_key(row, ["id"], topic), value=encode_value(row, topic))
    foreign.produce(topic, key=encode_key({"id": 4}, ["id"], topic), value=None)
    foreign.flush(30)

    drift = recover(dsn, store, "shop", topic, dry_run=True, **options)
    assert (drift.missing, drift.extra, drift.changed, drift.applied) == (1, 1, 1, 0)
    repaired = recover(dsn, store, "shop", topic, allow_mass_change=True, **options)
    assert repaired.applied == 3
    assert table_of(kafka_broker, topic) == want
    again = recover(dsn, store, "shop", topic, **options)
    assert (again.missing, again.extra, again.changed, again.applied) == (0, 0, 0, 0)
    # The repair's records say so (their txn and repair headers): 2 upserts and a tombstone.
    repaired_records = [h for _, _, h in read_topic(kafka_broker, topic) if REPAIR_HEADER in h]
    assert len(repaired_records) == 3
    assert {h["reconcile.epoch"] for h in repaired_records} == {"2"}


def test_a_topic_that_does_not_exist_is_named_at_start(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    sink = KafkaSink(kafka_broker.bootstrap, "no-such-topic", name="orders", key=["id"])
    cycle = CommitCycle("shop", [sink], str(tmp_path / "state"))
    with pytest.raises(ConfigurationError, match="topic 'no-such-topic' does not exist"):
        cycle.start()
    cycle.close()


def test_a_zombie_producer_is_fenced_by_the_broker(
    kafka_broker: KafkaBroker, kafka_topic: Callable[..., str]
) -> None:
    """A paused writer's open transaction never commits once a newer writer took over.

    The zombie prepared epoch 5 (its records are in the log, uncommitted); a newer
    generation's producer takes the same transactional.id, which makes the broker
    abort the zombie's transaction and refuse its commit.
    """
    topic = kafka_topic("zombie")
    options: dict[str, Any] = {
        "name": "orders",
        "key": ["id"],
        "marker_topic": f"{topic}-markers",
        "transactional_prefix": topic,
    }
    zombie = KafkaSink(kafka_broker.bootstrap, topic, **options)
    newer = KafkaSink(kafka_broker.bootstrap, topic, **options)
    old, new = SinkTxnId("shop", "orders", 5, 1), SinkTxnId("shop", "orders", 5, 2)
    assert zombie.stage(old, [{"id": 1, "v": "zombie"}]) == zombie.prepare(old) == OK
    assert newer.stage(new, [{"id": 1, "v": "newer"}]) == newer.prepare(new) == OK
    assert newer.commit(new) == OK
    # The broker refused the zombie's commit; the epoch is in (the newer writer's
    # marker), so its commit answers OK, and nothing of the zombie's is visible.
    assert zombie.commit(old) == OK
    after = SinkTxnId("shop", "orders", 6, 2)  # and the zombie did not fence the newer writer
    assert newer.stage(after, [{"id": 2, "v": "next"}]) == newer.prepare(after) == OK
    assert newer.commit(after) == OK
    rows = [decode_value(v or b"") for _, v, _ in read_topic(kafka_broker, topic)]
    assert rows == [{"id": 1, "v": "newer"}, {"id": 2, "v": "next"}]
    assert len(read_topic(kafka_broker, topic, committed=False)) > len(rows)  # the zombie's
    zombie.close()
    newer.close()


def test_a_repair_whose_marker_moved_since_the_pull_writes_nothing(
    kafka_broker: KafkaBroker, kafka_topic: Callable[..., str], tmp_path: Path
) -> None:
    topic = kafka_topic("moved", **{"cleanup.policy": "compact"})
    write_epochs(kafka_broker, topic, tmp_path, 2)
    sink = KafkaSink(kafka_broker.bootstrap, topic, name="orders", key=["id"],
                     marker_topic=f"{topic}-markers", transactional_prefix=topic)  # fmt: skip
    target = sink.recovery_target("shop", None, write=True)
    before = read_topic(kafka_broker, topic)
    upserts = pa.table({"id": [7000], "name": ["x"], "total": [1]})
    stale = Repair(upserts, pa.table({"id": pa.array([], pa.int64())}), 1, seen_newest=0)
    assert target.apply(stale) is None  # the sink's newest marker is 1, not 0
    assert read_topic(kafka_broker, topic) == before
    current = Repair(upserts, pa.table({"id": pa.array([], pa.int64())}), 1, seen_newest=1)
    assert target.apply(current) == 1
    assert len(read_topic(kafka_broker, topic)) == len(before) + 1
    sink.close()


@pytest.mark.parametrize("forged", ["repair marker", "fence"])
def test_a_forged_record_in_the_marker_topic_is_refused_and_nothing_is_written(
    kafka_broker: KafkaBroker, kafka_topic: Callable[..., str], tmp_path: Path, forged: str
) -> None:
    """Anyone who can produce to the marker topic can write a record of this log's id.

    A repair marker claiming epochs 0 to 1,000,000 would make every later epoch
    answer "already committed"; a fence of generation 1,000,000 would stop the
    writer as if a newer one ran. Both claim more than the store decided: the
    next epoch is refused naming the record, and the topic gets no record of it.
    """
    topic = kafka_topic("orders", **{"cleanup.policy": "compact"})
    write_epochs(kafka_broker, topic, tmp_path, 2)
    markers = f"{topic}-markers"
    state = MarkerLog({"bootstrap.servers": kafka_broker.bootstrap}, markers, "shop", "orders")
    before = state.read()
    assert before.marker is not None and before.marker.epoch == 1
    if forged == "fence":
        key, value = record_key("shop", "orders", "fence"), fence_value(10**6, before.fence_log_id)
    else:
        key = record_key("shop", "orders", "commit")
        value = marker_value(pipeline="shop", sink="orders", epoch=10**6, first_epoch=0,
                             generation=before.marker.generation, log_id=before.marker.log_id,
                             txn="forged", kind="repair")  # fmt: skip
    forger = Producer({"bootstrap.servers": kafka_broker.bootstrap})
    forger.produce(markers, key=key, value=value)
    assert forger.flush(10) == 0
    records_before = len(read_topic(kafka_broker, topic))

    expected = ExpectedState(str(tmp_path), "shop", {"orders": ["id"]})
    for attempt in range(2):  # and again after a restart: the record is still there
        sink = KafkaSink(kafka_broker.bootstrap, topic, name="orders", key=["id"],
                         marker_topic=markers, transactional_prefix=topic)  # fmt: skip
        cycle = CommitCycle("shop", [sink], expected_state=expected)
        cycle.start()
        try:
            result = cycle.run_epoch(2, {"orders": [{"id": 500, "name": "new", "total": 1}]})
        finally:
            cycle.close()
        assert isinstance(result, CommitFatal) and not result.restart, (attempt, result)
        assert isinstance(result.error, UntrustedRecordError)
        assert "1000000" in result.reason and markers in result.reason
        assert "epochs up to 1" in result.reason  # what the store decided
    assert len(read_topic(kafka_broker, topic)) == records_before  # nothing of epoch 2
    assert (500,) not in table_of(kafka_broker, topic)
