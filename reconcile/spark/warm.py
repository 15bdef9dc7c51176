"""Warm a standby's Spark for the first micro-batch it may have to run.

A new streaming query in a process that never ran one pays, in its first
micro-batch, for what every later batch gets for free: the executors' Python
workers are started and import pyarrow, psycopg, deltalake and the staging
code; the JVM compiles the transforms' joins and aggregations. Measured on
the TPC-H demo (2 cores, ``local[2,4]``): the first batch of a cold process
takes about 4 s, of a warmed one about 1.5 s, of a running one about 1 s.
That first batch is most of a takeover, so a standby warms itself while it
waits.

``warm_up`` runs an empty batch of the stream's schema through every sink's
transform and a task that imports the executors' staging code, and discards
the result: it reads no source, writes nothing, and commits nothing. A
transform is run with the batch id that comes next, so one that reads the
expected state as of the epoch before reads a decided epoch. Spark stops a
Python worker that was idle for a minute, so a standby warms itself again
every ``WARM_EVERY_S``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]

import reconcile.spark.staging  # noqa: F401  (imported for the executors: see _import_staging)
from reconcile.spark.outputs import Transform, apply_transform
from sinks import registry
from sinks.base import SHARED_STAGE

__all__ = ["WARM_EVERY_S", "warm_up"]

WARM_EVERY_S = 30.0  # below Spark's one-minute idle timeout of Python workers

_NOTHING = "warmed long"


def _import_staging(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """On an executor: import what staging a partition needs; read the input, yield nothing."""
    # The staging code: ours, the store's, and the backends' shared stages.
    registry.preload(SHARED_STAGE)
    for _ in batches:
        pass
    return iter(())


def warm_up(
    df: Any, sinks: Iterable[str], outputs: Mapping[str, Transform] | None, *, batch_id: int
) -> float:
    """Run an empty micro-batch of ``df``'s schema through every sink's path; seconds taken.

    Args:
        df: the streaming DataFrame (only its schema and session are used).
        sinks: the pipeline's sink names.
        outputs: sink name -> transform, as given to ``write_stream`` (None:
            the batch itself into every sink).
        batch_id: the id the transforms are given (the next epoch).
    """
    started = time.monotonic()
    spark = df.sparkSession
    empty = spark.createDataFrame([], df.schema)
    # As the writer does: with outputs, the sinks they name; without, the batch into each.
    transforms = dict(outputs) if outputs is not None else dict.fromkeys(sinks)
    for sink, transform in transforms.items():
        frame = empty
        if transform is not None:
            frame = apply_transform(transform, empty, batch_id, sink=sink)
        if not isinstance(frame, pa.Table):  # a table: the transform ran its own jobs already
            frame.mapInArrow(_import_staging, _NOTHING).collect()
    # A batch's staging runs a task per slot at once, each in a Python worker
    # of its own: start as many (one row per partition, so every task runs).
    slots = max(2, int(spark.sparkContext.defaultParallelism))
    spark.range(0, slots, 1, slots).mapInArrow(_import_staging, _NOTHING).collect()
    return time.monotonic() - started
