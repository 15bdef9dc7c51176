"""Pull-and-diff on a Kafka topic used as a table: read to the end, keep the last value per key.

A compacted topic is a table: a key's newest record is its row, a tombstone
(a record with a null value) its removal (the pull itself is
``sinks.kafka.pull``). A record without the engine's headers was produced by
someone else: it still counts as what the topic holds (a consumer sees it),
the report says how many there were, and the differing rows it wrote are
counted as foreign writes (``row_writers``, the report's provenance).

Rows are JSON, so the topic has no schema of its own: every column the expected
state names may be in its rows (a row without it holds NULL there), and each
value is converted to the expected state's type as it is read; a value that
does not convert is drift of its row, never dropped.

A repair is ONE Kafka transaction: the upserts and tombstones of the
difference, and a repair marker that stands for the epochs up to the target.
Kafka has no conditional write, so the repair's producer takes the sink's
``transactional.id``: its ``init_transactions`` fences the writer's producer
(whose next commit fails and is retried) and finishes whatever the writer had
in flight. The marker topic is read again after that: if an epoch committed
since the pull, nothing is written and the caller pulls again.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]

from reconcile.core.conform import SinkColumn, values_to_arrow
from reconcile.core.contract import (
    ConfigurationError,
    FencedError,
    InvalidInputError,
    RetryableError,
    SinkTxnId,
)
from reconcile.core.target import WRITER_COLUMNS, NoRowChecksums, Progress, Repair

from .markers import MarkerState, marker_value, record_key
from .pull import Pulled, pull_topic
from .records import EPOCH_HEADER, TXN_HEADER, encode_key, encode_value

if TYPE_CHECKING:
    from .sink import KafkaSink

__all__ = ["JSON_KIND", "KafkaRecoveryTarget", "pull_topic"]

JSON_KIND = "json"
_TIMEOUT_S = 60.0
_BATCH_ROWS = 65_536
REPAIR_HEADER = "reconcile.repair"


class _AnyColumn(dict[str, SinkColumn]):
    """The columns of a schemaless topic: whatever the expected state names is there."""

    def get(self, name: str, default: Any = None) -> SinkColumn:
        return SinkColumn(name, JSON_KIND, "a JSON value")


def _to_arrow(rows: list[dict[str, Any]], schema: pa.Schema) -> pa.Table:
    return values_to_arrow([[row.get(f.name) for row in rows] for f in schema], schema)


class _Snapshot(NoRowChecksums):
    """The topic as of the ends it had when the pull began (the protocol ``SinkSnapshot``)."""

    system = "Kafka"
    target: KafkaRecoveryTarget

    def __init__(self, target: KafkaRecoveryTarget, state: MarkerState, schema: pa.Schema,
                 keys: list[str]) -> None:  # fmt: skip
        self.target, self.schema, self.keys = target, schema, keys
        marker = state.marker
        self.newest_epoch = None if marker is None else marker.epoch
        self.marker_end = state.end_offset
        self.warnings: list[str] = []
        self.narrow_ranges = False
        self._pulled: Pulled | None = None

    def _fold(self, progress: Progress | None) -> Pulled:
        if self._pulled is None:
            sink = self.target.sink
            self._pulled = pull_topic(sink.client, sink.topic, self.keys, progress)
            if self._pulled.foreign:
                self.warnings.append(
                    f"{self._pulled.foreign} records of kafka topic {sink.topic!r} were not "
                    "written by the engine (no reconcile.txn header): another producer"
                )
        return self._pulled

    def pull_all(self, progress: Progress | None) -> pa.Table:
        return _to_arrow(list(self._fold(progress).rows.values()), self.schema)

    def pull_each(self, each: Callable[[pa.Table], None], progress: Progress | None) -> None:
        # The fold must see every record before any row is final: it is done
        # whole, then handed on in slices.
        rows = list(self._fold(progress).rows.values())
        for start in range(0, len(rows), _BATCH_ROWS):
            each(_to_arrow(rows[start : start + _BATCH_ROWS], self.schema))

    def estimated_rows(self) -> int | None:
        return None if self._pulled is None else len(self._pulled.rows)

    def pull_keys(self, keys: pa.Table, newer_than: int) -> pa.Table:
        """The rows of ``keys``, those a record past ``newer_than`` wrote, and foreign ones."""
        pulled = self._fold(None)
        topic = self.target.sink.topic
        wanted = {encode_key(dict(zip(self.keys, values, strict=True)), self.keys, topic)
                  for values in zip(*(keys.column(k).to_pylist() for k in self.keys),
                                    strict=True)}  # fmt: skip
        picked = []
        for key, row in pulled.rows.items():
            epoch = pulled.epochs[key]
            # A record of another producer carries no epoch: it is in scope always.
            if key in wanted or epoch is None or epoch > newer_than:
                picked.append(row)
        return _to_arrow(picked, self.schema)

    def row_writers(self, keys: pa.Table) -> tuple[pa.Table | None, bool, str]:
        """The rows of ``keys`` the topic holds, each with the record that wrote it.

        The writer is the engine's when the record's ``reconcile.txn`` names
        this pipeline and sink; any other record (no header: another
        producer; another pipeline's) is foreign. Kafka keeps no older
        records an engine could have pruned, so none is "before" a marker.
        """
        pulled, sink = self._fold(None), self.target.sink
        picked, meta = [], []
        for values in zip(*(keys.column(k).to_pylist() for k in self.keys), strict=True):
            key = encode_key(dict(zip(self.keys, values, strict=True)), self.keys, sink.topic)
            row, origin = pulled.rows.get(key), pulled.origins.get(key)
            if row is None or origin is None:
                continue
            picked.append(row)
            meta.append(origin)
        table = _to_arrow(picked, self.schema)
        xid, at, engine, before = WRITER_COLUMNS
        table = table.append_column(xid, pa.array([m.writer for m in meta], pa.string()))
        table = table.append_column(
            at, pa.array([m.committed_at for m in meta], pa.timestamp("us", tz="UTC"))
        )
        engine_of = [m.written_by(self.target.pipeline, sink.name) for m in meta]
        table = table.append_column(engine, pa.array(engine_of, pa.bool_()))
        table = table.append_column(before, pa.nulls(len(meta), pa.int64()))
        return table, True, ""

    def count_rows(self) -> int:
        return len(self._fold(None).rows)


class KafkaRecoveryTarget:
    """The ``RecoveryTarget`` of one Kafka topic (see ``KafkaSink``)."""

    bucket_checksums = False
    # Each record carries the epoch that wrote it: scoped mode can run.
    epoch_column = True

    def __init__(self, sink: KafkaSink, pipeline: str, generation: int | None) -> None:
        self.sink, self.pipeline, self.generation = sink, pipeline, generation

    @property
    def display(self) -> str:
        return f"kafka topic {self.sink.topic}"

    def columns(self) -> dict[str, SinkColumn]:
        return _AnyColumn()

    def key_columns(self) -> list[str]:
        return list(self.sink.key)

    @contextmanager
    def snapshot(self, schema: pa.Schema, keys: list[str]) -> Iterator[_Snapshot]:
        self.sink.check_topic()
        yield _Snapshot(self, self.sink.markers(self.pipeline).read(), schema, keys)

    def apply(self, repair: Repair) -> int | None:
        """The repair in ONE Kafka transaction with its marker, if no epoch committed since.

        Returns None (nothing written) when the sink's newest marker moved since
        the pull: the caller pulls again.

        Raises:
            FencedError: a newer writer generation holds the sink's fence.
            InvalidInputError: the target epoch is older than the sink's newest,
                or a row cannot be written.
            RetryableError: the brokers cannot be reached.
        """
        from confluent_kafka import KafkaException, Producer

        sink, topic = self.sink, self.sink.topic
        records: list[tuple[bytes, bytes | None]] = [
            (encode_key(r, sink.key, topic), None) for r in repair.deletes.to_pylist()
        ]
        records += [(encode_key(r, sink.key, topic), encode_value(r, topic))
                    for r in repair.upserts.to_pylist()]  # fmt: skip
        markers = sink.markers(self.pipeline)
        producer = Producer(
            {
                **sink.client,
                "transactional.id": f"{sink.transactional_prefix}.{self.pipeline}.{sink.name}",
                "transaction.timeout.ms": sink.transaction_timeout_ms,
            }
        )
        try:
            # Fences the writer's producer and finishes its open transaction,
            # so the marker read next is final until this repair commits.
            producer.init_transactions(_TIMEOUT_S)
            state = markers.read()
            if self.generation is not None and state.fence_generation > self.generation:
                raise FencedError(
                    f"kafka sink {sink.name!r}: generation {self.generation} is fenced off by "
                    f"{state.fence_generation}; nothing was written",
                    generation=self.generation,
                    fence=state.fence_generation,
                )
            newest = None if state.marker is None else state.marker.epoch
            if newest != repair.seen_newest:
                _abort_quietly(producer)
                return None  # an epoch committed since the pull: pull again
            if newest is not None and repair.target_epoch < newest:
                raise InvalidInputError(
                    f"kafka sink {sink.name!r}: cannot repair to epoch {repair.target_epoch}, "
                    f"older than the sink's newest epoch ({newest}); nothing was written"
                )
            owner = sink._log_id() if self.generation is not None else state.fence_log_id
            generation = self.generation if self.generation is not None else state.fence_generation
            advances = newest is None or newest < repair.target_epoch
            if not records and not advances:
                return 0
            repair_id = str(uuid.uuid4())
            txn = str(SinkTxnId(self.pipeline, sink.name, repair.target_epoch, max(generation, 1)))
            headers: list[tuple[str, str | bytes | None]] = [(TXN_HEADER, txn.encode()),
                       (EPOCH_HEADER, str(repair.target_epoch).encode()),
                       (REPAIR_HEADER, repair_id.encode())]  # fmt: skip
            producer.begin_transaction()
            for key, value in records:
                producer.produce(topic, key=key, value=value, headers=headers)
                producer.poll(0)
            if advances:
                producer.produce(
                    sink.marker_topic,
                    key=record_key(self.pipeline, sink.name, "commit"),
                    value=marker_value(
                        pipeline=self.pipeline,
                        sink=sink.name,
                        epoch=repair.target_epoch,
                        first_epoch=repair.target_epoch if newest is None else newest + 1,
                        generation=generation,
                        log_id=owner,
                        txn=f"repair {repair_id}",
                        kind="repair",
                    ),
                )
            producer.commit_transaction(_TIMEOUT_S)
        except KafkaException as err:
            _abort_quietly(producer)
            raise RetryableError(
                f"kafka sink {sink.name!r}: repair of topic {topic!r} failed ({err}); a "
                "repair that did not commit wrote nothing: run it again"
            ) from None
        return len(records)

    def close(self) -> None:
        self.sink.close()


def _abort_quietly(producer: Any) -> None:
    """Abort whatever the producer has open; a producer that cannot is dropped anyway."""
    try:
        producer.abort_transaction(5)
    except Exception:  # nothing open, or the broker is away: it aborts on its own timeout
        return


def pullable_sink(
    dsn: str,
    table: str,
    *,
    name: str,
    schema: str | None = None,
    key: Sequence[str] | None = None,
) -> KafkaSink:
    """The sink recovery pulls from: topic ``table`` on the brokers of ``dsn`` (``kafka://``).

    Raises:
        ConfigurationError: no key columns, or a ``schema`` (topics have none).
    """
    from .factory import brokers_of
    from .sink import KafkaSink

    if not key:
        raise ConfigurationError(
            f"kafka topic {table!r}: give the table's keys (keys = [...] in the config file)"
        )
    if schema is not None:
        raise ConfigurationError(
            f"kafka topic {schema}.{table}: a topic has no schema; name it without one"
        )
    bootstrap, marker_topic = brokers_of(name, dsn)
    return KafkaSink(bootstrap, table, name=name, key=key, marker_topic=marker_topic)
