"""What runs inside the executor tasks of the distributed verify and repair.

Each task gets a small frozen job (the sink's connection, the store's schema,
the driver's exported snapshot, the key ranges) pickled into it, and opens its
own connections: pulls import the driver's snapshot and read one key range
each, cast to the expected state's types; repairs apply their share of the
diff in bounded transactions, each fenced and re-checked like an in-process
repair. The sink's backend provides the client (``sinks.base.SPARK_PULL``:
PostgreSQL's). See ``reconcile.spark.verify``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]

from reconcile.core.conform import conform
from reconcile.core.target import KeyRange, Repair
from sinks import registry
from sinks.base import SPARK_PULL

__all__ = ["ACTUAL", "BAD", "HASH", "KIND", "ApplyJob", "PullJob", "SinkAt", "apply", "pull"]

BAD = "_bad"  # a pulled row with a value that does not convert to the expected type
KIND = "_kind"  # missing | extra | changed
HASH = "_row_hash"
ACTUAL = "_actual_hash"


@dataclass(frozen=True)
class SinkAt:
    """What an executor task needs to open the sink table (pickled into every task)."""

    dsn: str = field(repr=False)  # holds the password: never shown
    table: str
    schema: str | None
    keys: tuple[str, ...] | None  # None: the table's primary key
    name: str
    pipeline: str

    def target(self, *, write: bool) -> Any:
        """The table's recovery target, from its backend's ``SPARK_PULL`` client (the task's own).

        It is the backend's own kind of target: besides ``RecoveryTarget`` it
        opens a snapshot the driver exported (``shared=``), which a task joins.
        """
        client = registry.capability(self.dsn, SPARK_PULL)
        sink = client(self.dsn, self.table, name=self.name, schema=self.schema, key=self.keys)
        return sink.recovery_target(self.pipeline, None, write=write)


@dataclass(frozen=True)
class PullJob:
    sink: SinkAt
    store_schema: pa.Schema
    shared: str  # the driver's exported snapshot
    ranges: tuple[KeyRange, ...]


def pull(job: PullJob, ids: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """On an executor: pull the ranges whose numbers arrive, conformed to the store's types."""
    target = job.sink.target(write=False)
    try:
        with target.snapshot(
            job.store_schema,
            list(job.sink.keys or ()),
            shared=job.shared,
            # Which executor process (and its parent) holds which pull, in
            # pg_stat_activity: the worker may be gone when someone looks.
            application_name=f"reconcile-pull-{os.getpid()}-{os.getppid()}",
        ) as snap:
            for batch in ids:
                for index in batch.column(0).to_pylist():
                    raw = snap.pull_ranges([job.ranges[index]])
                    rows, bad = conform(raw, job.store_schema)
                    flags = np.zeros(rows.num_rows, dtype=bool) if bad is None else bad
                    yield from rows.append_column(BAD, pa.array(flags)).to_batches()
    finally:
        target.close()


@dataclass(frozen=True)
class ApplyJob:
    sink: SinkAt
    store_schema: pa.Schema
    epoch: int
    newest: int | None
    batch_rows: int


def _chunks(batches: Iterator[pa.RecordBatch], size: int) -> Iterator[pa.Table]:
    pending: list[pa.RecordBatch] = []
    rows = 0
    for batch in batches:
        pending.append(batch)
        rows += batch.num_rows
        if rows >= size:
            table = pa.Table.from_batches(pending)
            for start in range(0, table.num_rows - table.num_rows % size, size):
                yield table.slice(start, size)
            rest = table.slice(table.num_rows - table.num_rows % size)
            pending, rows = rest.to_batches(), rest.num_rows
    if rows:
        yield pa.Table.from_batches(pending)


def apply(job: ApplyJob, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """On an executor: apply the task's share of the diff, ``batch_rows`` rows a transaction."""
    import pyarrow.compute as pc  # type: ignore[import-untyped, unused-ignore]

    keys = list(job.sink.keys or ())
    names = job.store_schema.names
    target = job.sink.target(write=True)
    applied = stale = transactions = 0
    try:
        for chunk in _chunks(batches, job.batch_rows):
            kind = chunk.column(KIND)
            extra = pc.equal(kind, "extra")
            upserts = chunk.filter(pc.invert(extra)).select(names).cast(job.store_schema)
            deletes = chunk.filter(extra).select(keys)
            counts = {k: int(pc.sum(pc.equal(kind, k)).as_py() or 0)
                      for k in ("missing", "extra", "changed")}  # fmt: skip
            done = target.apply(
                Repair(
                    upserts=upserts,
                    deletes=deletes,
                    target_epoch=job.epoch,
                    seen_newest=job.newest,
                    counts=counts,
                    mode="full",
                )
            )
            transactions += 1
            if done is None:
                stale += chunk.num_rows  # an epoch committed since the pull: run again
            else:
                applied += done
    finally:
        target.close()
    yield pa.RecordBatch.from_pydict(
        {"applied": [applied], "stale": [stale], "transactions": [transactions]},
        schema=pa.schema(
            [("applied", pa.int64()), ("stale", pa.int64()), ("transactions", pa.int64())]
        ),
    )
