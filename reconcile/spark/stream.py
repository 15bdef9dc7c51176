"""Exactly-once Structured Streaming: every micro-batch is one epoch of the commit cycle.

``write_stream(df, build, ...)`` wires a streaming DataFrame into one or more
sink tables through ``foreachBatch``; the micro-batch id is the epoch. For
each micro-batch:

1. the executors stage their partitions of every sink's DataFrame as Arrow IPC
   files under ``staging`` (one file per task, in a folder of its own for this
   run of the batch); only the file names and row counts reach the driver;
2. the driver memory-maps the files of the tasks Spark reports as successful
   and hands them to the commit cycle as Arrow tables: one epoch, with the
   expected state recorded first when the cycle has one;
3. the cycle commits it in every sink (``reconcile.Driver``: retries, restarts
   and resolution of an ambiguous COMMIT as in ``drive``), then the batch's
   staging folder is removed, and only then does ``foreachBatch`` return and
   Spark write the batch to its commit log.

Why it is exactly-once:

- Spark re-runs a micro-batch whose commit-log entry is missing (the driver
  died anywhere above) with the same batch id; the cycle knows that epoch:
  finalized, it is a no-op (``replayed``); decided but not in every sink, it is
  finished; recorded but never decided, ``start()`` reverts it and the re-run's
  rows are recorded instead.
- A task that fails and is retried, or runs twice speculatively, may leave a
  file behind, but the driver reads only the files named by the rows the
  successful attempts returned (Spark keeps one result per partition), so no
  partition counts twice.
- Which run wins when a transform is not deterministic on replay (it stamps
  ``current_timestamp()``, samples, or reads a changing table): the run that
  reached the decision, for every sink with an expected state (a sink that
  missed its commit is given the RECORDED rows, never the re-run's); a run
  that died before the decision leaves nothing anywhere, and the re-run wins.
  A sink without an expected state that must be written again after the
  decision is given the re-run's rows: give every sink keys in the expected
  state when transforms are not deterministic.

The staging folder must be one path that the driver and every executor see
(a shared or network filesystem on a real cluster, any local folder on one
machine); the driver reads the staged rows by memory map, so they are not sent
through Spark's collect, and are never held by the JVM.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]

from reconcile import hooks
from reconcile.contract import ConfigurationError, FatalError, InvalidInputError
from reconcile.cycle import CommitCycle
from reconcile.driver import Driver, DriveReport, RetryPolicy
from reconcile.progress import EpochStatus
from reconcile.results import CommitSucceeded

__all__ = ["StreamWriter", "outputs_of", "read_staged", "stage_batches", "write_stream"]

log = logging.getLogger("reconcile.spark.stream")

# Inside an executor's task: its partition's file is written and closed, and
# the task has not yet returned it (a task killed here leaves a file no one names).
PARTITION_STAGED = hooks.declare("stream.partition_staged")
# On the driver: every task of the batch has staged its rows; nothing is recorded.
BATCH_STAGED = hooks.declare("stream.batch_staged")
# On the driver: the epoch is in every sink; Spark has not written its commit log.
BATCH_COMMITTED = hooks.declare("stream.batch_committed")

Transform = Callable[[Any], Any]  # a micro-batch DataFrame -> a sink's DataFrame
STAGED_SCHEMA = "path string, rows long"


def stage_batches(folder: str, batches: Iterable[pa.RecordBatch]) -> tuple[str, int] | None:
    """On an executor: write a task's batches as one Arrow IPC file in ``folder``.

    Returns the file's path and row count, or None for no rows (no file is
    left). The file name is new for every task attempt, so a retried or
    speculative attempt never overwrites a file another attempt may return.
    """
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"part-{uuid.uuid4().hex}.arrow")
    writer = None
    rows = 0
    try:
        for batch in batches:
            if writer is None:
                writer = pa.ipc.new_file(path, batch.schema)
            writer.write_batch(batch)
            rows += batch.num_rows
    finally:
        if writer is not None:
            writer.close()
    if writer is None:
        return None
    hooks.point(PARTITION_STAGED)
    return path, rows


def _stage_partition(folder: str, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``mapInArrow``'s function: stage the partition, yield one (path, rows) row if any."""
    staged = stage_batches(folder, batches)
    if staged is not None:
        yield pa.RecordBatch.from_pydict(
            {"path": [staged[0]], "rows": [staged[1]]},
            schema=pa.schema([("path", pa.string()), ("rows", pa.int64())]),
        )


def read_staged(
    paths: Sequence[str], rows: int, schema: pa.Schema, *, batch_id: int, sink: str
) -> pa.Table:
    """The staged files as one Arrow table, memory-mapped (the OS pages it in as it is read).

    Raises:
        FatalError: the files hold another number of rows than the tasks reported.
    """
    tables = [pa.ipc.open_file(pa.memory_map(p)).read_all() for p in paths]
    if not tables:
        table = schema.empty_table()
    else:
        table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
    if table.num_rows != rows:
        raise FatalError(
            f"micro-batch {batch_id}, sink {sink!r}: the staged files hold {table.num_rows} "
            f"rows, the tasks reported {rows}; nothing was recorded",
            epoch=batch_id,
        )
    return table


def outputs_of(
    pipeline: str, batch_id: int, staged: Mapping[str, pa.Table]
) -> Callable[[int], Mapping[str, Iterable[Any]]]:
    """``Driver.run``'s outputs: the staged rows for this batch, ``_Gone`` for any other."""

    def outputs(epoch: int) -> Mapping[str, Iterable[Any]]:
        if epoch == batch_id:
            return staged
        return _Gone(pipeline, epoch, batch_id)

    return outputs


@dataclass
class BatchStats:
    """What the writer did for one micro-batch (the newest is ``StreamWriter.last``)."""

    batch_id: int
    rows: dict[str, int] = field(default_factory=dict)  # sink -> rows staged
    files: dict[str, int] = field(default_factory=dict)  # sink -> files staged
    replayed: bool = False  # the epoch was already in every sink: nothing was staged


class StreamWriter:
    """The ``foreachBatch`` function that commits each micro-batch as one epoch.

    Args:
        build: makes a CommitCycle over fresh sink clients (as ``drive`` takes):
            called once, and again after a restart the cycle asks for.
        outputs: sink name -> a function from the micro-batch DataFrame to that
            sink's DataFrame (a select, a filter, an aggregation of the batch).
            By default every sink gets the batch as it is.
        staging: the folder executors stage rows in; every executor and the
            driver must see it at this path.
        retry: how long an epoch is retried before the query fails.

    The cycle is started at the first micro-batch and kept across batches:
    one writer generation per run of the query.
    """

    def __init__(
        self,
        build: Callable[[], CommitCycle],
        outputs: Mapping[str, Transform] | None = None,
        *,
        staging: str | os.PathLike[str],
        retry: RetryPolicy | None = None,
    ) -> None:
        self.outputs = dict(outputs) if outputs is not None else None
        self.staging = os.path.abspath(os.fspath(staging))
        self.driver = Driver(build, retry=retry)
        self.last: BatchStats | None = None

    @property
    def report(self) -> DriveReport:
        """Epochs committed and skipped, retries and restarts, over every batch so far."""
        return self.driver.report

    def _transforms(self, cycle: CommitCycle) -> dict[str, Transform]:
        if self.outputs is None:
            return {name: _identity for name in cycle.sinks}
        unknown = sorted(set(self.outputs) - set(cycle.sinks))
        if unknown:
            raise ConfigurationError(
                f"pipeline {cycle.pipeline!r}: outputs for {unknown}, which are not its sinks "
                f"({sorted(cycle.sinks)})"
            )
        return self.outputs

    def _finalized(self, cycle: CommitCycle, batch_id: int) -> bool:
        """Whether the epoch is in every sink already (a re-run batch): skip staging it."""
        if not self.driver.started:
            return False  # start() may still settle it: the cycle decides, in run()
        return cycle.progress.status(batch_id) is EpochStatus.FINALIZED

    def __call__(self, batch: Any, batch_id: int) -> None:
        """Commit micro-batch ``batch_id`` (``batch``: its DataFrame) as epoch ``batch_id``."""
        cycle = self.driver.current()  # its sinks and name; Driver.run starts it
        stats = BatchStats(batch_id)
        self.last = stats
        if self._finalized(cycle, batch_id):
            stats.replayed = True
            log.info("pipeline %s: micro-batch %d is in every sink already", cycle.pipeline,
                     batch_id)  # fmt: skip
            return
        transforms = self._transforms(cycle)
        run_folder = os.path.join(
            self.staging, cycle.pipeline, f"e{batch_id:012d}-{uuid.uuid4().hex}"
        )
        try:
            staged = self._stage(batch, batch_id, transforms, run_folder, stats)
            hooks.point(BATCH_STAGED)
            self.driver.run(batch_id, outputs_of(cycle.pipeline, batch_id, staged))
            result = self.report.results[-1] if self.report.results else None
            stats.replayed = isinstance(result, CommitSucceeded) and result.replayed
            hooks.point(BATCH_COMMITTED)
        finally:
            # This run's files are needed by nothing once run() returned or
            # raised: a re-run of the batch stages its own.
            shutil.rmtree(run_folder, ignore_errors=True)
        self._sweep(cycle.pipeline, batch_id)

    def _stage(
        self,
        batch: Any,
        batch_id: int,
        transforms: Mapping[str, Transform],
        run_folder: str,
        stats: BatchStats,
    ) -> dict[str, pa.Table]:
        """Have the executors stage every sink's rows; the staged files as Arrow tables."""
        from pyspark.sql.pandas.types import to_arrow_schema

        staged: dict[str, pa.Table] = {}
        for sink, transform in transforms.items():
            frame = transform(batch)
            folder = os.path.join(run_folder, sink)
            written = frame.mapInArrow(
                functools.partial(_stage_partition, folder), STAGED_SCHEMA
            ).collect()
            paths = [row["path"] for row in written]
            stats.rows[sink] = sum(int(row["rows"]) for row in written)
            stats.files[sink] = len(paths)
            tz = batch.sparkSession.conf.get("spark.sql.session.timeZone")
            schema = to_arrow_schema(frame.schema, timezone=tz)
            staged[sink] = read_staged(
                paths, stats.rows[sink], schema, batch_id=batch_id, sink=sink
            )
        return staged

    def _sweep(self, pipeline: str, batch_id: int) -> None:
        """Remove staging folders of batches up to ``batch_id`` left by a dead driver."""
        root = os.path.join(self.staging, pipeline)
        try:
            names = os.listdir(root)
        except FileNotFoundError:
            return
        for name in names:
            if name.startswith("e") and name[1:13].isdigit() and int(name[1:13]) <= batch_id:
                shutil.rmtree(os.path.join(root, name), ignore_errors=True)

    def close(self) -> None:
        """Close the cycle's sinks (the query has stopped)."""
        self.driver.close()


def _identity(batch: Any) -> Any:
    return batch


class _Gone(Mapping[str, Iterable[Any]]):
    """The outputs of an earlier micro-batch, which Spark will not compute again.

    Asked for only when a restart finds an earlier epoch committed in the log
    and missing from a sink without a durable prepare: a sink with an expected
    state is given the recorded rows instead and never asks; any other sink
    would get nothing, so asking is an error, never an empty batch.
    """

    def __init__(self, pipeline: str, epoch: int, batch_id: int) -> None:
        self.pipeline, self.epoch, self.batch_id = pipeline, epoch, batch_id

    def __getitem__(self, sink: str) -> Iterable[Any]:
        raise FatalError(
            f"pipeline {self.pipeline!r}: epoch {self.epoch} is committed but not in sink "
            f"{sink!r}, and its micro-batch is gone (the stream is at batch {self.batch_id}); "
            "give the sink an expected state (keys) so that its recorded rows can be replayed",
            epoch=self.epoch,
        )

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


def write_stream(
    df: Any,
    build: Callable[[], CommitCycle],
    *,
    checkpoint: str | os.PathLike[str],
    staging: str | os.PathLike[str],
    outputs: Mapping[str, Transform] | None = None,
    trigger: Mapping[str, Any] | None = None,
    query_name: str | None = None,
    retry: RetryPolicy | None = None,
) -> Any:
    """Start a streaming query that writes ``df`` exactly once through ``build()``'s cycle.

    Args:
        df: a streaming DataFrame.
        build: makes the pipeline's CommitCycle (sinks, and an expected state).
        checkpoint: Spark's checkpoint folder; restart the query with the same
            one (and the same ``build``) to resume.
        staging: where executors stage rows (see ``StreamWriter``).
        outputs: sink name -> transform of the micro-batch; default: the batch
            itself into every sink.
        trigger: ``DataStreamWriter.trigger`` keyword arguments, e.g.
            ``{"processingTime": "1 second"}`` or ``{"availableNow": True}``;
            default: the next micro-batch as soon as the last one is done.
        query_name: the query's name in Spark's UI and metrics.

    Returns:
        The started ``StreamingQuery``; its ``reconcile_writer`` attribute is
        the StreamWriter (its report, its last batch's stats).

    Raises:
        InvalidInputError: ``df`` is not a streaming DataFrame.
    """
    if not getattr(df, "isStreaming", False):
        raise InvalidInputError(
            "write_stream() takes a streaming DataFrame (spark.readStream...); for a batch "
            "DataFrame, run its epochs with reconcile.drive"
        )
    writer = StreamWriter(build, outputs, staging=staging, retry=retry)
    stream = df.writeStream.foreachBatch(writer).option("checkpointLocation", os.fspath(checkpoint))
    if trigger:
        stream = stream.trigger(**trigger)
    if query_name:
        stream = stream.queryName(query_name)
    query = stream.start()
    query.reconcile_writer = writer
    return query
