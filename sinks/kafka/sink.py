"""An exactly-once sink into a Kafka topic: one Kafka transaction per epoch, with its marker.

``prepare`` begins a transaction on a transactional producer, produces the
epoch's records (a keyed record per upsert, a tombstone per delete) and a marker
record into the engine's marker topic (``markers.py``), and flushes them, so
that a record the broker refuses (too large, a topic that is not there) is
known before the commit point; ``commit`` commits the transaction. Nothing is
visible to a ``read_committed`` consumer before the commit, and nothing survives
the producer: the prepare is not durable, like an open database transaction,
and the cycle replays an epoch a crash took with it (the marker makes the replay
exactly-once).

Zombies are fenced twice:

- by the broker: the ``transactional.id`` is stable per (pipeline, sink), so a
  newer writer's ``init_transactions`` fences every older producer of the sink,
  whose next send or commit the broker refuses (``ProducerFenced``);
- by generation: a writer commits a fence record of its generation before its
  first epoch, and a client of an older generation that reads it refuses to
  start a producer at all (which would fence the newer one's).

A ``commit_transaction`` without a definite answer is never guessed. The client
throws its producer away and initialises a new one with the same
``transactional.id``: the broker then finishes the old transaction, committed
if its commit had been received and aborted otherwise, before it answers. Then
the marker topic, read to its end with ``read_committed``, says whether the
epoch is in.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypedDict, Unpack

from reconcile.core.claims import Claim, check_claim
from reconcile.core.contract import (
    OK,
    Change,
    ConfigurationError,
    Fatal,
    FencedError,
    InvalidInputError,
    MarkerMismatchError,
    Ok,
    Retryable,
    RetryableError,
    RowsRejectedError,
    SinkOutcome,
    SinkTxnId,
    WriterIdentity,
    validate_name,
)
from reconcile.core.sink import SinkCapabilities
from sinks.open_txn import OpenTxnSink

from .markers import MarkerLog, MarkerState
from .producing import TIMEOUT_S, HeldProducer, KafkaTxn, ProducerSteps, Record
from .records import encode_key, encode_value

__all__ = ["DEFAULT_MARKER_TOPIC", "KafkaKeywords", "KafkaSink", "Record"]

log = logging.getLogger("reconcile.sinks.kafka")

DEFAULT_MARKER_TOPIC = "reconcile_commits"
_COMMIT_ATTEMPTS = 3


class KafkaKeywords(TypedDict, total=False):
    """The Kafka sink's options beyond its topic, name and key.

    Attributes:
        marker_topic: the engine's marker topic (created, compacted, if missing);
            default ``reconcile_commits``.
        transactional_prefix: the ``transactional.id`` is ``<prefix>.<pipeline>.<sink>``;
            default ``reconcile``.
        transaction_timeout_ms: the broker aborts a transaction open longer
            than this (capped by the broker's ``transaction.max.timeout.ms``);
            default 60 s.
        config: more librdkafka settings for the producer and the consumers
            (security, for example); the sink's own settings win.
    """

    marker_topic: str
    transactional_prefix: str
    transaction_timeout_ms: int
    config: Mapping[str, Any]


class KafkaSink(ProducerSteps, OpenTxnSink[KafkaTxn, list[Record]]):
    """Exactly-once sink into one Kafka topic used as a table (key to its last value).

    Args:
        bootstrap: the brokers (``host:port,host:port``).
        topic: the topic the rows go to; it must exist.
        name: the sink's name within the pipeline.
        key: the key columns: a row's record key (``records.py``).
        pipeline: optional; ``bind()`` supplies it.
        **options: the keywords of :class:`KafkaKeywords`.
    """

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        *,
        name: str,
        key: Sequence[str],
        pipeline: str | None = None,
        **options: Unpack[KafkaKeywords],
    ) -> None:
        self._name = validate_name("sink", name)
        self.pipeline = None if pipeline is None else validate_name("pipeline", pipeline)
        if not key:
            raise ConfigurationError(f"kafka sink {name!r}: give the key columns (key=[...])")
        self.bootstrap, self.topic, self.key = bootstrap, topic, list(key)
        self.marker_topic = options.get("marker_topic", DEFAULT_MARKER_TOPIC)
        self.transactional_prefix = options.get("transactional_prefix", "reconcile")
        self.transaction_timeout_ms = options.get("transaction_timeout_ms", 60_000)
        config = options.get("config") or {}
        self.client: dict[str, Any] = {**dict(config), "bootstrap.servers": bootstrap}
        self._writer: WriterIdentity | None = None
        self._markers: MarkerLog | None = None
        self._producer: HeldProducer | None = None
        OpenTxnSink.__init__(self)

    # -- identity and set-up ------------------------------------------------

    @property
    def name(self) -> str:
        return self._name

    @property
    def capabilities(self) -> SinkCapabilities:
        """Not durable (a producer's open transaction); pullable from a compacted topic."""
        return SinkCapabilities(durable_prepare=False, pullable=True)

    def __repr__(self) -> str:
        return f"KafkaSink(name={self._name!r}, topic={self.topic!r}, bootstrap={self.bootstrap!r})"

    def markers(self, pipeline: str) -> MarkerLog:
        """The marker topic as this sink reads it (created and checked on first use)."""
        if self._markers is None or self._markers.pipeline != pipeline:
            markers = MarkerLog(self.client, self.marker_topic, pipeline, self._name)
            markers.ensure()
            self._markers = markers
        return self._markers

    def check_topic(self) -> None:
        """Refuse a data topic that does not exist, naming it (it is never created here).

        Raises:
            ConfigurationError: the topic is not on the brokers.
            RetryableError: the brokers cannot be reached.
        """
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient

        try:
            topics = AdminClient(self.client).list_topics(timeout=TIMEOUT_S).topics
        except KafkaException as err:
            raise RetryableError(
                f"kafka sink {self._name!r}: cannot reach {self.bootstrap}: {err}"
            ) from None
        if self.topic not in topics:
            raise ConfigurationError(
                f"kafka sink {self._name!r}: topic {self.topic!r} does not exist on "
                f"{self.bootstrap}; create it (cleanup.policy=compact to use it as a table "
                "that verify and repair can pull)"
            )

    def bind(self, writer: WriterIdentity) -> None:
        """Bind to the pipeline's writer: the topic exists, the marker topic is ours.

        Raises:
            ConfigurationError: another pipeline, or no such topic.
            MarkerMismatchError: another progress log wrote this sink's fence.
        """
        if self.pipeline is not None and self.pipeline != writer.pipeline:
            raise ConfigurationError(
                f"kafka sink {self._name!r} was built for pipeline {self.pipeline!r}, bound "
                f"to {writer.pipeline!r}"
            )
        self._writer, self.pipeline = writer, writer.pipeline
        self.check_topic()
        state = self.markers(writer.pipeline).read()
        if state.fence_generation and state.fence_log_id != writer.log_id:
            raise MarkerMismatchError(
                f"kafka sink {self._name!r}: its fence in {self.marker_topic!r} belongs to "
                f"progress log {state.fence_log_id!r}, not to this pipeline's "
                f"{writer.log_id!r}; another state wrote this sink",
                found_log_id=state.fence_log_id,
            )

    # -- the contract ---------------------------------------------------------

    def _check_txn(self, txn_id: SinkTxnId) -> Fatal | None:
        if txn_id.sink != self._name or self.pipeline not in (None, txn_id.pipeline):
            return Fatal.of(ConfigurationError(f"kafka sink {self._name!r} got txn {txn_id}"))
        return None

    def _sink_label(self) -> str:
        return f"kafka sink {self._name!r}"

    def stage(self, txn_id: SinkTxnId, rows: Iterable[Any]) -> SinkOutcome:
        """Encode the rows as records now: a key that cannot be written is refused here."""
        if (bad := self._check_txn(txn_id)) is not None:
            return bad
        records: list[Record] = []
        try:
            for item in _rows(rows):
                if isinstance(item, Change):
                    key = encode_key(item.row, self.key, self.topic)
                    value = None if item.op == "delete" else encode_value(item.row, self.topic)
                elif isinstance(item, Mapping):
                    key = encode_key(item, self.key, self.topic)
                    value = encode_value(item, self.topic)
                else:
                    raise InvalidInputError(
                        f"kafka sink {self._name!r}: cannot stage a {type(item).__name__}"
                    )
                records.append(Record(key, value))
        except InvalidInputError as err:
            # A row the topic cannot take is the epoch's rejection, whoever finds it
            # (the same exit code and metric as a broker's refusal).
            return Fatal.of(
                RowsRejectedError.of(
                    epoch=txn_id.epoch,
                    table=self.topic,
                    sqlstate="",
                    reason=err.message,
                    sink=self._name,
                    column=err.details.get("column"),
                )
            )
        self._staged[txn_id.key] = records
        return OK

    def _marker_outcome(self, state: MarkerState, txn_id: SinkTxnId) -> SinkOutcome | None:
        """OK if this writer's marker stands for the epoch; Fatal if another's; else None."""
        marker = state.marker
        if marker is None or not marker.covers(txn_id.epoch):
            return None
        if marker.log_id != self._log_id():
            return Fatal.of(
                MarkerMismatchError(
                    f"kafka sink {self._name!r}: epoch {txn_id.epoch} is in marker topic "
                    f"{self.marker_topic!r} as txn {marker.txn} of progress log "
                    f"{marker.log_id!r}; this writer's is {self._log_id()!r}. It is NOT "
                    "treated as committed, and nothing was written",
                    epoch=txn_id.epoch,
                    found_log_id=marker.log_id,
                )
            )
        # A marker of this log is trusted only for epochs the store decided and a
        # generation it granted: anyone who can produce to the marker topic could
        # write one claiming every future epoch (reconcile.core.claims).
        claim = Claim(
            sink=self._name,
            what=self._sink_label(),
            record=f"{marker.kind} marker at offset {marker.offset} of {self.marker_topic!r}",
            kind=marker.kind,
            epoch=marker.epoch,
            first_epoch=marker.first_epoch,
            generation=marker.generation,
        )
        refused = check_claim(claim, None if self._writer is None else self._writer.decisions)
        return OK if refused is None else Fatal.of(refused)

    def _fenced(self, state: MarkerState, txn_id: SinkTxnId) -> Fatal | None:
        if state.fence_generation > txn_id.generation:
            # A fence of a generation the store never granted is a forgery, named
            # as one rather than obeyed as a newer writer's.
            fence = Claim(
                sink=self._name,
                what=self._sink_label(),
                record=f"fence record in {self.marker_topic!r}",
                kind="fence",
                epoch=None,
                generation=state.fence_generation,
            )
            refused = check_claim(fence, None if self._writer is None else self._writer.decisions)
            if refused is not None:
                return Fatal.of(refused)
            return Fatal.of(
                FencedError(
                    f"kafka sink {self._name!r}: generation {txn_id.generation} is fenced off "
                    f"by {state.fence_generation}; nothing was written",
                    generation=txn_id.generation,
                    fence=state.fence_generation,
                )
            )
        return None

    def prepare(self, txn_id: SinkTxnId) -> SinkOutcome:
        """Begin the epoch's transaction, produce its records and marker, flush. It stays open."""
        if (bad := self._check_txn(txn_id)) is not None:
            return bad
        self._discard(txn_id.key)  # preparing a prepared epoch replaces it
        staged = self._staged.get(txn_id.key)
        try:
            markers = self.markers(txn_id.pipeline)
            state = markers.read()
            done = self._marker_outcome(state, txn_id)
            if done is None and staged is None:
                return Retryable(f"kafka sink {self._name!r}: nothing staged for {txn_id}")
            if done is None:
                done = self._fenced(state, txn_id)
            if done is None:
                producer, state = self._producer_for(txn_id, state)
                # A new producer settled whatever the transactional.id had in
                # flight: an earlier attempt's COMMIT may have landed meanwhile.
                done = self._marker_outcome(state, txn_id)
                if done is None:
                    done = self._fenced(state, txn_id)
        except (ConfigurationError, MarkerMismatchError) as err:
            return Fatal.of(err)
        except RetryableError as err:
            return Retryable.of(err)
        if done is not None:
            if isinstance(done, Ok):
                self._hold_committed(txn_id)
            return done
        assert staged is not None
        return self._write(txn_id, producer, staged)

    # -- the steps of the open-transaction lifecycle (sinks.open_txn) -----------

    _marker_unreadable = (RetryableError,)

    def _commit_open(self, txn_id: SinkTxnId, held: KafkaTxn) -> SinkOutcome:
        """Commit the open transaction; without a definite answer, a new producer and the marker."""
        from confluent_kafka import KafkaException

        for _ in range(_COMMIT_ATTEMPTS):
            try:
                held.producer.commit_transaction(TIMEOUT_S)
                return OK
            except KafkaException as err:
                error = err.args[0]
                log.warning("kafka sink %r: commit of %s: %s", self._name, txn_id, error)
                if error.retriable():
                    continue  # librdkafka's commit is safe to call again
                if error.txn_requires_abort():
                    self._abandon(held.producer)
                    return Retryable(f"kafka sink {self._name!r}: {txn_id} was aborted by the "
                                     f"broker ({error.str()}); nothing was committed")  # fmt: skip
                break
        # A COMMIT without a definite answer: the producer is thrown away, and
        # a new one with the same transactional.id makes the broker finish the
        # old transaction before it answers; then the marker decides. Not for a
        # generation that a newer one fenced off: its new producer would fence
        # the live writer's in turn; the marker alone answers it.
        if self._producer is not None and self._producer.producer is held.producer:
            self._producer = None
        try:
            state = self.markers(txn_id.pipeline).read()
            found = self._marker_outcome(state, txn_id)
            if found is None:
                found = self._fenced(state, txn_id)
            if found is not None:
                return found
            _, state = self._producer_for(txn_id, state)
        except RetryableError as err:
            return Retryable.of(err)
        found = self._marker_outcome(state, txn_id)
        if found is not None:
            return found
        return Fatal(
            f"kafka sink {self._name!r}: {txn_id} did not commit (its marker is not in "
            f"{self.marker_topic!r} once the broker finished it); replay the epoch"
        )

    def _settle_by_marker(self, txn_id: SinkTxnId) -> SinkOutcome:
        try:
            done = self._read_marker(txn_id)
        except RetryableError as err:
            return Retryable.of(err)
        if done is not None:
            return done
        return Fatal(
            f"kafka sink {self._name!r}: {txn_id} is not open in this process and has no "
            "marker: it did not commit; replay the epoch (prepare again)"
        )

    def _read_marker(self, txn_id: SinkTxnId) -> SinkOutcome | None:
        return self._marker_outcome(self.markers(txn_id.pipeline).read(), txn_id)

    def _roll_back(self, held: KafkaTxn) -> None:
        self._abandon(held.producer)

    def recovery_target(self, pipeline: str, generation: int | None, *, write: bool) -> Any:
        """This sink's topic as a pull-and-diff target (``reconcile.recovery``)."""
        from .recovery import KafkaRecoveryTarget

        return KafkaRecoveryTarget(self, pipeline, generation)

    def close(self) -> None:
        """Abort open epochs; let go of the producer."""
        self._discard_all()
        self._producer = None


def _rows(rows: Iterable[Any]) -> Iterable[Any]:
    """Rows, Changes or Arrow tables, as rows and Changes."""
    import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]

    if isinstance(rows, pa.Table):
        yield from rows.to_pylist()
        return
    for item in rows:
        if isinstance(item, pa.Table):
            yield from item.to_pylist()
        else:
            yield item
