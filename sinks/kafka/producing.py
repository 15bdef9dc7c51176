"""The producer side of the Kafka sink: one transactional producer per writer generation.

``ProducerSteps`` is what ``KafkaSink`` does with a producer: start one for a
generation (``init_transactions`` makes the broker finish whatever the
``transactional.id`` had in flight, and fences every older producer of it),
commit the generation's fence record the first time, write an epoch's records
and marker in one transaction, and sort what the broker or the client refused:
a record too large is the database's kind of rejection (the pipeline stops,
naming the topic); a topic that cannot be written is a configuration error; a
producer the broker fenced is either a newer writer's takeover (FencedError) or
a repair's (the next attempt starts a producer again); anything else is
retried.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from reconcile.core.contract import (
    OK,
    ConfigurationError,
    Fatal,
    FencedError,
    RejectedError,
    Retryable,
    RetryableError,
    SinkOutcome,
    SinkTxnId,
    WriterIdentity,
)

from .markers import MarkerLog, MarkerState, fence_value, marker_value, record_key
from .records import EPOCH_HEADER, TXN_HEADER

__all__ = ["HeldProducer", "KafkaTxn", "ProducerSteps", "Record"]

log = logging.getLogger("reconcile.sinks.kafka")

TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Record:
    """One record of an epoch: its key, its value (None: a tombstone, a delete)."""

    key: bytes
    value: bytes | None


@dataclass
class HeldProducer:
    """A transactional producer, initialised for one writer generation."""

    producer: Any
    generation: int


@dataclass(frozen=True)
class KafkaTxn:
    """An epoch transaction ``prepare`` began and flushed: the producer that holds it."""

    producer: Any


class ProducerSteps:
    """The producer steps of ``KafkaSink`` (which sets these attributes)."""

    _name: str
    topic: str
    client: dict[str, Any]
    marker_topic: str
    transaction_timeout_ms: int
    _writer: WriterIdentity | None
    _producer: HeldProducer | None

    transactional_prefix: str
    pipeline: str | None
    # KafkaSink's and OpenTxnSink's, as this class uses them (annotations only:
    # a stub here would come before OpenTxnSink's method in the sink's MRO).
    markers: Callable[[str], MarkerLog]
    _hold: Callable[[SinkTxnId, KafkaTxn], None]

    @property
    def transactional_id(self) -> str:
        """``<prefix>.<pipeline>.<sink>``: stable, so a newer producer fences older ones."""
        return f"{self.transactional_prefix}.{self.pipeline}.{self._name}"

    def _log_id(self) -> str | None:
        return None if self._writer is None else self._writer.log_id

    def _write(self, txn_id: SinkTxnId, producer: Any, staged: list[Record]) -> SinkOutcome:
        from confluent_kafka import KafkaException

        failures: list[str] = []

        def delivered(err: Any, message: Any) -> None:
            if err is not None:
                failures.append(f"{message.topic()}: {err.name()}: {err.str()}")

        headers = [(TXN_HEADER, str(txn_id).encode()), (EPOCH_HEADER, str(txn_id.epoch).encode())]
        try:
            producer.begin_transaction()
            for record in staged:
                try:
                    producer.produce(self.topic, key=record.key, value=record.value,
                                     headers=headers, on_delivery=delivered)  # fmt: skip
                except BufferError:
                    producer.poll(1)  # the local queue is full: let deliveries drain
                    producer.produce(self.topic, key=record.key, value=record.value,
                                     headers=headers, on_delivery=delivered)  # fmt: skip
            producer.produce(
                self.marker_topic,
                key=record_key(txn_id.pipeline, self._name, "commit"),
                value=marker_value(
                    pipeline=txn_id.pipeline,
                    sink=self._name,
                    epoch=txn_id.epoch,
                    generation=txn_id.generation,
                    log_id=self._log_id(),
                    txn=str(txn_id),
                ),
                on_delivery=delivered,
            )
            left = producer.flush(TIMEOUT_S)
        except KafkaException as err:
            self._abandon(producer)
            return self._refused(txn_id, err.args[0], None)
        if failures or left:
            self._abandon(producer)
            reason = failures[0] if failures else f"{left} records not delivered in time"
            return self._refused(txn_id, None, reason)
        self._hold(txn_id, KafkaTxn(producer))
        return OK

    def _refused(self, txn_id: SinkTxnId, error: Any, reason: str | None) -> SinkOutcome:
        """The outcome of a prepare the broker or the client refused; nothing was committed."""
        text = str(reason) if error is None else f"{error.name()}: {error.str()}"
        code = "" if error is None else str(error.name())
        if (
            "MSG_SIZE_TOO_LARGE" in text
            or "RECORD_LIST_TOO_LARGE" in text
            or code.endswith("MSG_SIZE_TOO_LARGE")
        ):
            return Fatal.of(
                RejectedError.of(
                    epoch=txn_id.epoch,
                    table=self.topic,
                    sqlstate="",
                    reason=f"a record is larger than the broker or topic takes ({text}); "
                    "raise max.message.bytes on the topic, or write smaller rows",
                    sink=self._name,
                )
            )
        if "UNKNOWN_TOPIC" in text or "TOPIC_AUTHORIZATION" in text:
            return Fatal.of(
                ConfigurationError(
                    f"kafka sink {self._name!r}, prepare of {txn_id}: topic {self.topic!r} "
                    f"cannot be written ({text}); nothing was committed"
                )
            )
        if error is not None and error.fatal():
            # The broker fenced this producer: another one took the transactional.id.
            # A newer writer's fence says it took over; without one it was a
            # repair, and the next attempt starts a producer of its own again.
            self._producer = None
            try:
                state = self.markers(txn_id.pipeline).read()
            except RetryableError as err:
                return Retryable.of(err)
            if state.fence_generation > txn_id.generation:
                return Fatal.of(
                    FencedError(
                        f"kafka sink {self._name!r}, prepare of {txn_id}: the broker fenced "
                        f"this producer ({text}), and generation {state.fence_generation} "
                        "took over; nothing was committed",
                        generation=txn_id.generation,
                        fence=state.fence_generation,
                    )
                )
        return Retryable(f"kafka sink {self._name!r}, prepare of {txn_id}: {text}; nothing was "
                         "committed")  # fmt: skip

    # -- producers ------------------------------------------------------------

    def _producer_for(self, txn_id: SinkTxnId, state: MarkerState) -> tuple[Any, MarkerState]:
        """This generation's producer (initialised, its fence committed), and the markers after.

        Raises:
            RetryableError: the broker cannot be reached, or refused for now.
        """
        from confluent_kafka import KafkaException, Producer

        held = self._producer
        if held is not None and held.generation == txn_id.generation:
            return held.producer, state
        self._producer = None
        producer = Producer(
            {
                **self.client,
                "transactional.id": self.transactional_id,
                "transaction.timeout.ms": self.transaction_timeout_ms,
                "enable.idempotence": True,
                "client.id": f"reconcile-{self._name}-{uuid.uuid4().hex[:8]}",
            }
        )
        try:
            producer.init_transactions(TIMEOUT_S)
            if state.fence_generation < txn_id.generation:
                producer.begin_transaction()
                producer.produce(
                    self.marker_topic,
                    key=record_key(txn_id.pipeline, self._name, "fence"),
                    value=fence_value(txn_id.generation, self._log_id()),
                )
                producer.commit_transaction(TIMEOUT_S)
        except KafkaException as err:
            raise RetryableError(
                f"kafka sink {self._name!r}: cannot start a transactional producer "
                f"({self.transactional_id}): {err}"
            ) from None
        self._producer = HeldProducer(producer, txn_id.generation)
        return producer, self.markers(txn_id.pipeline).read()

    def _abandon(self, producer: Any) -> None:
        """Abort the producer's open transaction (best effort) and let go of the producer."""
        try:
            producer.abort_transaction(TIMEOUT_S)
        except Exception as err:  # a fenced or broken producer: the broker aborts it
            log.warning("kafka sink %r: abort failed (%s); dropping the producer", self._name, err)
            if self._producer is not None and self._producer.producer is producer:
                self._producer = None
