"""The Kafka sink under bad input and faults: each a clear error or a retry, never a lost record.

- a ``commit_transaction`` whose reply is lost, before or after the broker
  committed: settled by a new producer and the marker, never guessed;
- a key that cannot be written: refused at stage, naming the topic and column;
- a record over the topic's ``max.message.bytes``: the epoch is rejected,
  naming the topic, and nothing is visible;
- the broker killed mid-run and restarted, and a broker that aborts a
  transaction left open past its timeout: the epochs are retried, and a
  ``read_committed`` consumer sees each record once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from reconcile import CommitCycle
from reconcile.core.contract import (
    OK,
    Fatal,
    InvalidInputError,
    RejectedError,
    RowsRejectedError,
    SinkOutcome,
    SinkTxnId,
)
from reconcile.engine.driver import RetryPolicy, drive
from reconcile.testing.kafka_broker import KafkaBroker
from sinks.kafka.producing import HeldProducer, KafkaTxn
from sinks.kafka.records import decode_key
from sinks.kafka.sink import KafkaSink
from sinks.memory.sink import MemorySink, MemoryStore
from tests.fix_kafka import create_topic, read_topic

pytestmark = pytest.mark.integration


def kafka_sink(bootstrap: str, topic: str) -> KafkaSink:
    return KafkaSink(bootstrap, topic, name="out", key=["id"],
                     marker_topic=f"{topic}-markers", transactional_prefix=topic)  # fmt: skip


class LostReply:
    """A producer whose commit_transaction raises as if its reply were lost.

    ``landed``: the broker got the commit (it committed) before the reply was lost.
    """

    def __init__(self, producer: Any, *, landed: bool) -> None:
        self.producer, self.landed, self.calls = producer, landed, 0

    def commit_transaction(self, timeout: float) -> None:
        self.calls += 1
        if self.landed:
            self.producer.commit_transaction(timeout)
        raise KafkaException(KafkaError(KafkaError._TRANSPORT, "reply lost (test)"))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.producer, name)


@pytest.mark.parametrize("landed", [True, False], ids=["after-the-commit", "before-it"])
def test_a_commit_whose_reply_is_lost_is_settled_by_the_marker(
    kafka_broker: KafkaBroker, kafka_topic: Callable[..., str], landed: bool
) -> None:
    topic = kafka_topic("lost")
    sink = kafka_sink(kafka_broker.bootstrap, topic)
    txn = SinkTxnId("shop", "out", 0, 1)
    assert sink.stage(txn, [{"id": 1, "v": 1}]) == sink.prepare(txn) == OK
    held = sink._open[txn.key]
    assert held.held is not None
    lossy = LostReply(held.held.producer, landed=landed)
    held.held = KafkaTxn(lossy)
    sink._producer = HeldProducer(lossy, 1)  # the sink's own producer is the lossy one
    outcome = sink.commit(txn)
    assert lossy.calls == 1  # the fault fired
    keys = [decode_key(k or b"", ["id"]) for k, _, _ in read_topic(kafka_broker, topic)]
    if landed:
        assert outcome == OK and keys == [{"id": 1}]
    else:
        # Not in: the caller replays the epoch; the old transaction was aborted by the
        # broker when the new producer started, so nothing of it can land later.
        assert isinstance(outcome, Fatal) and "did not commit" in outcome.reason
        assert keys == []
        assert sink.stage(txn, [{"id": 1, "v": 1}]) == sink.prepare(txn) == OK
        assert sink.commit(txn) == OK
        keys = [decode_key(k or b"", ["id"]) for k, _, _ in read_topic(kafka_broker, topic)]
        assert keys == [{"id": 1}]
    sink.close()


def test_a_key_that_cannot_be_written_is_refused_at_stage_naming_it(
    kafka_broker: KafkaBroker, kafka_topic: Callable[..., str]
) -> None:
    topic = kafka_topic("badkey")
    sink = kafka_sink(kafka_broker.bootstrap, topic)
    outcome = sink.stage(SinkTxnId("shop", "out", 0, 1), [{"id": object(), "v": 1}])
    assert isinstance(outcome, Fatal) and isinstance(outcome.error, RowsRejectedError)
    assert isinstance(outcome.error, InvalidInputError) and outcome.error.epoch == 0
    assert f"kafka topic {topic!r}: column 'id' holds a object" in outcome.reason
    nulls = sink.stage(SinkTxnId("shop", "out", 0, 1), [{"id": None, "v": 1}])
    assert isinstance(nulls, Fatal) and "no value for key column 'id'" in nulls.reason
    sink.close()


def test_a_record_over_the_topic_s_limit_rejects_the_epoch_and_writes_nothing(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    topic = create_topic(kafka_broker, "small", **{"max.message.bytes": "2000"})

    def build() -> CommitCycle:
        return CommitCycle("shop", [kafka_sink(kafka_broker.bootstrap, topic)],
                           str(tmp_path / "state"))  # fmt: skip

    rows = {0: [{"id": 1, "v": "x"}], 1: [{"id": 2, "v": "y" * 5000}]}
    fast = RetryPolicy(give_up_after_s=30, initial_s=0.0, max_s=0.0, jitter_s=0.0)
    with pytest.raises(RejectedError) as rejected:
        drive(build, range(2), lambda e: {"out": rows[e]}, retry=fast)
    assert rejected.value.epoch == 1 and rejected.value.table == topic
    assert "larger than the broker or topic takes" in str(rejected.value)
    keys = [decode_key(k or b"", ["id"]) for k, _, _ in read_topic(kafka_broker, topic)]
    assert keys == [{"id": 1}]


class SlowMemory(MemorySink):
    """A memory sink whose prepare sleeps the first ``n`` times (the Kafka txn waits open)."""

    def __init__(self, store: MemoryStore, seconds: float, times: int) -> None:
        super().__init__("slow", store)
        self.seconds, self.times = seconds, times

    def prepare(self, txn_id: SinkTxnId) -> SinkOutcome:
        if self.times:
            self.times -= 1
            time.sleep(self.seconds)
        return super().prepare(txn_id)


def _outputs(epoch: int) -> dict[str, Iterable[Any]]:
    rows = [{"id": epoch * 10 + i, "v": epoch} for i in range(3)]
    return {"out": rows, "slow": rows}


def _each_once(bootstrap: str, topic: str, epochs: int) -> None:
    keys = [decode_key(k or b"", ["id"])["id"] for k, _, _ in read_topic(bootstrap, topic)]
    assert sorted(keys) == [e * 10 + i for e in range(epochs) for i in range(3)]


@pytest.mark.slow
def test_a_transaction_the_broker_aborts_for_its_timeout_is_retried_exactly_once(
    tmp_path: Path,
) -> None:
    settings = {"transaction.abort.timed.out.transaction.cleanup.interval.ms": 200}
    with KafkaBroker(**settings) as broker:
        topic = create_topic(broker, "timeout")
        store = MemoryStore()
        slow = SlowMemory(store, seconds=4.0, times=1)

        def build() -> CommitCycle:
            sink = kafka_sink(broker.bootstrap, topic)
            sink.transaction_timeout_ms = 1000  # shorter than the slow sink's prepare
            return CommitCycle("shop", [sink, slow], str(tmp_path / "state"))

        report = drive(build, range(3), _outputs)
        assert report.committed_epochs == [0, 1, 2] and slow.times == 0
        _each_once(broker.bootstrap, topic, 3)
        # The fault fired: the broker aborted the first attempt's transaction, whose
        # records stay in the log, invisible to read_committed (the epoch was replayed).
        everything = read_topic(broker.bootstrap, topic, committed=False)
        assert len(everything) > len(read_topic(broker.bootstrap, topic))


@pytest.mark.slow
def test_the_broker_killed_mid_run_and_restarted_loses_and_duplicates_nothing(
    tmp_path: Path,
) -> None:
    with KafkaBroker() as broker:
        topic = create_topic(broker, "outage")
        epochs = 6

        outage: list[str] = []

        def back() -> None:
            broker.start()
            outage.append("restarted")

        def outputs(epoch: int) -> dict[str, Iterable[Any]]:
            if epoch == 2 and not outage:
                broker.kill9()  # mid-run: the epoch's prepare meets no broker
                outage.append("killed")
                threading.Timer(3.0, back).start()
            return {"out": _outputs(epoch)["out"]}

        def build() -> CommitCycle:
            return CommitCycle("shop", [kafka_sink(broker.bootstrap, topic)],
                               str(tmp_path / "state"))  # fmt: skip

        report = drive(build, range(epochs), outputs, retry=RetryPolicy(give_up_after_s=240))
        assert report.committed_epochs == list(range(epochs))
        assert outage == ["killed", "restarted"]  # the outage happened, mid-run, and ended
        _each_once(broker.bootstrap, topic, epochs)
