"""``reconcile verify|repair|watch --config FILE`` on a compacted Kafka topic, as real processes.

A pipeline writes a compacted topic (sink ``orders``) through a commit cycle
with an expected state; another producer then changes the topic (a value, a
new key, a tombstone: records without the engine's headers). The commands,
reading the topic from the config file, find that drift, count its records as
another producer's, and undo it in one Kafka transaction with its marker. The
topic is checked with a ``read_committed`` consumer, not the engine's books.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from reconcile import CommitCycle, CommitSucceeded
from reconcile.core.contract import Change
from reconcile.engine.expected import ExpectedState
from reconcile.testing.kafka_broker import KafkaBroker
from sinks.kafka.markers import MarkerLog
from sinks.kafka.records import decode_key, decode_value, encode_key, encode_value
from sinks.kafka.recovery import REPAIR_HEADER
from sinks.kafka.sink import KafkaSink
from tests.cli_run import cli
from tests.fix_kafka import read_topic

pytestmark = pytest.mark.integration

EPOCHS = 3


def table_of(broker: KafkaBroker, topic: str) -> dict[int, dict[str, Any]]:
    """What a read_committed consumer holds as a table: the last value per key."""
    rows: dict[int, dict[str, Any]] = {}
    for key, value, _ in read_topic(broker, topic):
        assert key is not None
        k = decode_key(key, ["id"])["id"]
        if value is None:
            rows.pop(k, None)
        else:
            rows[k] = decode_value(value)
    return rows


def written(broker: KafkaBroker, topic: str, tmp_path: Path, epochs: int = EPOCHS) -> str:
    """``epochs`` epochs of sink ``orders`` of pipeline ``shop`` in ``topic``; the config file."""
    expected = ExpectedState(str(tmp_path / "expected"), "shop", {"orders": ["id"]})
    sink = KafkaSink(broker.bootstrap, topic, name="orders", key=["id"],
                     marker_topic=f"{topic}-markers")  # fmt: skip
    cycle = CommitCycle("shop", [sink], expected_state=expected)
    cycle.start()
    try:
        for e in range(epochs):
            rows: list[Any] = [{"id": i, "qty": i + e} for i in range(e * 5, e * 5 + 8)]
            if e:
                rows.append(Change("delete", {"id": e * 5 - 5}))
            assert cycle.run_epoch(e, {"orders": rows}) == CommitSucceeded(e)
    finally:
        cycle.close()
    config = tmp_path / "reconcile.toml"
    config.write_text(
        f"""
[store]
root = "expected"

[pipelines.shop.sinks.orders]
url = "kafka://{broker.bootstrap}?marker_topic={topic}-markers"
table = "{topic}"
keys = ["id"]
max_change_fraction = 0.5
"""
    )
    return str(config)


def produce_by_hand(broker: KafkaBroker, topic: str, rows: list[dict[str, Any]],
                    tombstones: list[int]) -> None:  # fmt: skip
    """Records of another producer: no transaction, none of the engine's headers."""
    foreign = Producer({"bootstrap.servers": broker.bootstrap})
    for row in rows:
        foreign.produce(topic, key=encode_key(row, ["id"], topic), value=encode_value(row, topic))
    for key in tombstones:
        foreign.produce(topic, key=encode_key({"id": key}, ["id"], topic), value=None)
    assert foreign.flush(30) == 0


def test_verify_and_repair_a_topic_from_the_config_file(
    kafka_broker: KafkaBroker, kafka_topic: Callable[..., str], tmp_path: Path
) -> None:
    topic = kafka_topic("orders", **{"cleanup.policy": "compact"})
    config = written(kafka_broker, topic, tmp_path)
    want = table_of(kafka_broker, topic)
    produce_by_hand(kafka_broker, topic, [{"id": 3, "qty": -1}, {"id": 999, "qty": 1}], [4])

    drift = cli("verify", "--config", config, "--all", "--json")
    assert drift.returncode == 1, drift.stderr
    [found] = json.loads(drift.stdout)["tables"]
    assert (found["missing"], found["extra"], found["changed"]) == (1, 1, 1)
    # The changed and the extra row are another producer's records, and said to be.
    assert found["foreign_rows"] == 2
    assert any("3 records" in w and "another producer" in w for w in found["warnings"])
    assert table_of(kafka_broker, topic) != want  # verify wrote nothing

    repaired = cli("repair", "--config", config, "--all")
    assert repaired.returncode == 1, repaired.stderr  # drift was found (and repaired)
    assert f"shop.orders ({topic}): missing 1, extra 1, changed 1" in repaired.stdout
    assert table_of(kafka_broker, topic) == want
    # Exactly the difference, in one transaction: 2 upserts and a tombstone.
    repair_records = [r for r in read_topic(kafka_broker, topic) if REPAIR_HEADER in r[2]]
    by_repair = [(k, v) for k, v, _ in repair_records]
    assert sorted((decode_key(k or b"", ["id"])["id"], v is None) for k, v in by_repair) == [
        (3, False), (4, False), (999, True)]  # fmt: skip
    assert len({h[REPAIR_HEADER] for _, _, h in repair_records}) == 1
    # It repaired to the newest epoch: the marker is still that epoch's commit.
    marker = MarkerLog({"bootstrap.servers": kafka_broker.bootstrap}, f"{topic}-markers",
                       "shop", "orders").read().marker  # fmt: skip
    assert marker is not None and marker.epoch == EPOCHS - 1

    again = cli("verify", "--config", config, "--all", "--json")
    assert again.returncode == 0, again.stderr + again.stdout


@pytest.mark.slow
def test_watch_repairs_the_newest_epochs_of_a_topic_in_scoped_mode(
    kafka_broker: KafkaBroker, kafka_topic: Callable[..., str], tmp_path: Path
) -> None:
    topic = kafka_topic("orders", **{"cleanup.policy": "compact"})
    config = written(kafka_broker, topic, tmp_path)
    want = table_of(kafka_broker, topic)
    newest = (EPOCHS - 1) * 5 + 2  # a row the newest epoch wrote
    produce_by_hand(kafka_broker, topic, [{"id": newest, "qty": -1}], [])
    watched = cli("watch", "--config", config, "--pipeline", "shop", "--every", "1s",
                  "--count", "1", "--epochs", "2", "--repair", "--json")  # fmt: skip
    assert watched.returncode == 1, watched.stderr  # its one round found drift
    [round_] = [json.loads(line) for line in watched.stdout.splitlines()]
    [first] = round_["tables"]
    assert (first["mode"], first["changed"], first["applied"]) == ("scoped", 1, 1)
    assert first["foreign_rows"] == 1
    assert table_of(kafka_broker, topic) == want
    assert cli("verify", "--config", config, "--all").returncode == 0
