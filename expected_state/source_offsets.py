"""Where each epoch's input came from: the source offsets of every epoch, durable in the store.

A stream that reads a log (Kafka) has no file list to read again; what a
rebuild needs to replay epoch e is the range of offsets the micro-batch read,
per topic and partition. Spark's checkpoint has them (its offset log), but
keeps only the newest hundred micro-batches; the store keeps them for as long
as it keeps the epochs.

One Delta table ``<root>/_sources`` for every pipeline of the store, one row
per (epoch, topic, partition): ``[from_offset, to_offset)``. Each epoch's rows
are appended in ONE commit whose token is ``Transaction("<pipeline>#sources",
epoch)``: recording an epoch again (a micro-batch re-run after a crash reads
the same offsets, which Spark's offset log fixes before the batch runs) writes
nothing.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from expected_state.delta_commit import DeltaCommit, commit_files
from expected_state.delta_files import write_data_file
from reconcile.core.contract import InvalidInputError, validate_name

__all__ = ["SOURCES_TABLE", "OffsetRange", "SourceOffsets"]

SOURCES_TABLE = "_sources"

_SCHEMA = pa.schema(
    [
        pa.field("pipeline", pa.string(), nullable=False),
        pa.field("epoch", pa.int64(), nullable=False),
        pa.field("topic", pa.string(), nullable=False),
        pa.field("partition", pa.int32(), nullable=False),
        pa.field("from_offset", pa.int64(), nullable=False),
        pa.field("to_offset", pa.int64(), nullable=False),
    ]
)


@dataclass(frozen=True, order=True)
class OffsetRange:
    """The records one epoch read of one partition: offsets ``from_offset`` to ``to_offset - 1``."""

    topic: str
    partition: int
    from_offset: int
    to_offset: int


class SourceOffsets:
    """The source offsets of ``pipeline``'s epochs in the store at ``root``."""

    def __init__(self, root: str, pipeline: str) -> None:
        self.root = str(root).rstrip("/")
        self.pipeline = validate_name("pipeline", pipeline)
        self.uri = f"{self.root}/{SOURCES_TABLE}"
        self._app_id = f"{pipeline}#sources"

    def recorded_through(self) -> int | None:
        """The newest epoch whose offsets are recorded (the table's token); None: none."""
        try:
            table = DeltaTable(self.uri)
        except TableNotFoundError:
            return None
        found = table.transaction_version(self._app_id)
        return None if found is None else int(found)

    def record(self, epoch: int, ranges: Sequence[OffsetRange]) -> bool:
        """Record ``epoch``'s offset ranges in ONE commit; False if it was recorded already.

        Raises:
            InvalidInputError: a range that ends before it begins.
            RetryableError: the commit lost to concurrent writers too often.
        """
        for r in ranges:
            if r.to_offset < r.from_offset or r.from_offset < 0:
                raise InvalidInputError(
                    f"pipeline {self.pipeline!r}, epoch {epoch}: offsets of {r.topic} "
                    f"partition {r.partition} go from {r.from_offset} to {r.to_offset}"
                )
        done = self.recorded_through()
        if done is not None and done >= epoch:
            return False
        rows = pa.table(
            {
                "pipeline": [self.pipeline] * len(ranges),
                "epoch": [epoch] * len(ranges),
                "topic": [r.topic for r in ranges],
                "partition": [r.partition for r in ranges],
                "from_offset": [r.from_offset for r in ranges],
                "to_offset": [r.to_offset for r in ranges],
            },
            schema=_SCHEMA,
        )
        name = f"{self.pipeline}-{epoch:012d}-{uuid.uuid4().hex[:8]}.parquet"
        written = write_data_file(self.uri, name, rows)
        result = commit_files(
            DeltaCommit(
                table_uri=self.uri,
                schema=_SCHEMA,
                app_id=self._app_id,
                version=epoch,
                add=[written],
                custom_metadata={"reconcile.sources_epoch": epoch},
            )
        )
        return bool(result.committed)

    def ranges(self, through: int) -> dict[int, list[OffsetRange]]:
        """Epoch -> its offset ranges, for every recorded epoch up to ``through``."""
        try:
            table = DeltaTable(self.uri)
        except TableNotFoundError:
            return {}
        found: dict[int, list[OffsetRange]] = {}
        for r in table.to_pyarrow_table().to_pylist():
            if r["pipeline"] != self.pipeline or r["epoch"] > through:
                continue
            found.setdefault(int(r["epoch"]), []).append(
                OffsetRange(
                    r["topic"], int(r["partition"]), int(r["from_offset"]), int(r["to_offset"])
                )
            )
        return {epoch: sorted(found[epoch]) for epoch in sorted(found)}
