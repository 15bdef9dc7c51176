"""Exactly-once Structured Streaming: every micro-batch is one epoch of the commit cycle.

``write_stream(df, build, ...)`` wires a streaming DataFrame into one or more
sink tables through ``foreachBatch``; the micro-batch id is the epoch. For
each micro-batch:

1. every sink's rows are staged (``reconcile.spark.staging``), one of three
   ways (``via``):

   - collected: a micro-batch that Spark sizes as small (its input estimate
     at most ``collect_max_bytes``; ``via="auto"``, the default) is brought to
     the driver by Spark's own Arrow collect, one job per sink and no Python
     in the tasks: the cheapest way for the small batches of a low-latency
     stream;
   - on the executors: for a Postgres sink with an expected state, each task
     writes store change files and rows in the sink's own staging table
     (in the engine's schema), so that no row passes through the driver; only file names,
     task-attempt ids and counts reach it. For the batches too large to
     collect;
   - through files: any other sink's rows as Arrow IPC files that the driver
     memory-maps (``via="driver"`` sends every sink this way);
2. the driver hands them to the commit cycle as one epoch, with the expected
   state recorded first when the cycle has one (the change files added in one
   tokened commit, or the driver's rows written);
3. the cycle commits it in every sink (``reconcile.Driver``: retries, restarts
   and resolution of an ambiguous COMMIT as in ``drive``), then the batch's
   staged files and staging-table rows are removed, and only then does
   ``foreachBatch`` return and Spark write the batch to its commit log.

Why it is exactly-once:

- Spark re-runs a micro-batch whose commit-log entry is missing (the driver
  died anywhere above) with the same batch id; the cycle knows that epoch:
  finalized, it is a no-op (``replayed``); decided but not in every sink, it is
  finished; recorded but never decided, ``start()`` reverts it and the re-run's
  rows are recorded instead.
- A task that fails and is retried, or runs twice speculatively, may leave a
  file or committed staging rows behind, but the driver takes only what the
  successful attempts returned (Spark keeps one result per partition, a
  collect included): the files they name, the staging rows of their attempt
  ids. No partition counts twice.
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
machine).
"""

from __future__ import annotations

import logging
import os
import shutil
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Unpack

from expected_state.source_offsets import SourceOffsets
from reconcile.core import hooks
from reconcile.core.contract import ConfigurationError, InvalidInputError
from reconcile.core.progress import EpochStatus
from reconcile.core.results import CommitSucceeded
from reconcile.engine.cycle import CommitCycle
from reconcile.engine.driver import Driver, DriveReport, RetryPolicy
from reconcile.spark.batch_stage import BatchStager, BatchStats
from reconcile.spark.kafka_offsets import batch_offsets
from reconcile.spark.options import StreamKeywords, StreamOptions
from reconcile.spark.outputs import Transform, apply_transform, identity, outputs_of
from reconcile.spark.staging import (
    COLLECT_MAX_BYTES,
    VIAS,
)

__all__ = [
    "COLLECT_MAX_BYTES", "VIAS", "BatchStats", "StreamOptions", "StreamWriter", "apply_transform",
    "outputs_of", "start_query", "write_stream",
]  # fmt: skip

log = logging.getLogger("reconcile.spark.stream")

# On the driver: every task of the batch has staged its rows; nothing is recorded.
BATCH_STAGED = hooks.declare("stream.batch_staged")
# On the driver: the epoch is in every sink; Spark has not written its commit log.
BATCH_COMMITTED = hooks.declare("stream.batch_committed")

# Batches ``StreamWriter.history`` keeps: as many as Spark's recentProgress.
HISTORY = 100


class StreamWriter:
    """The ``foreachBatch`` function that commits each micro-batch as one epoch.

    Args:
        build: makes a CommitCycle over fresh sink clients (as ``drive`` takes):
            called once, and again after a restart the cycle asks for.
        outputs: sink name -> a function from the micro-batch DataFrame to that
            sink's DataFrame (a select, a filter, an aggregation of the batch),
            or to a ``pyarrow.Table`` of rows it made on the driver (handed to
            the cycle as they are, whatever ``via``); a function of two
            arguments is also given the batch id. By default every sink gets
            the batch as it is.
        staging: the folder executors stage rows in; every executor and the
            driver must see it at this path.
        retry: how long an epoch is retried before the query fails.
        via: "auto" (default): a micro-batch whose input Spark estimates at
            most ``collect_max_bytes`` is collected to the driver (Spark's
            Arrow collect); a larger one as with "executors". "executors": a
            Postgres sink with an expected state is written from the
            executors (a staging table and store change files; no row passes
            through the driver); every other sink through staged files the
            driver reads. "driver": every sink through staged files the
            driver reads (any size: the files are memory-mapped).
        collect_max_bytes: the largest input estimate ``via="auto"`` collects.
            A collect larger than ``spark.driver.maxResultSize`` all the same
            (a transform that multiplies its rows) is staged the other way.
            With no such limit (``maxResultSize=0``) nothing is collected:
            nothing would stop a collect that outgrows the driver.

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
        via: str = "auto",
        collect_max_bytes: int = COLLECT_MAX_BYTES,
        checkpoint: str | os.PathLike[str] | None = None,
    ) -> None:
        self.outputs = dict(outputs) if outputs is not None else None
        self.checkpoint = None if checkpoint is None else os.fspath(checkpoint)
        self.staging = os.path.abspath(os.fspath(staging))
        self.driver = Driver(build, retry=retry)
        self.stager = BatchStager(self.staging, via, collect_max_bytes, self.driver.policy)
        self.history: deque[BatchStats] = deque(maxlen=HISTORY)  # the newest batches, oldest first
        # What stopped the query, as raised in this process, and its epoch (see __call__).
        self.failure: BaseException | None = None
        self.failed_epoch: int | None = None

    @property
    def last(self) -> BatchStats | None:
        """The newest micro-batch's figures (None before the first)."""
        return self.history[-1] if self.history else None

    @property
    def report(self) -> DriveReport:
        """Epochs committed and skipped, retries and restarts, over every batch so far."""
        return self.driver.report

    def _transforms(self, cycle: CommitCycle) -> dict[str, Transform]:
        if self.outputs is None:
            return {name: identity for name in cycle.sinks}
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
        """Commit micro-batch ``batch_id`` (``batch``: its DataFrame) as epoch ``batch_id``.

        Raises:
            Whatever stops the epoch (see ``reconcile.drive``), which fails the
            query. It is kept in ``failure`` first: past ``foreachBatch``, Spark
            hands the error on as the text of a Java exception, and the typed
            error (a RejectedError with its epoch and table, a FencedError) is
            what a caller decides from (``reconcile.core.decisions.classify``).
        """
        try:
            self._commit(batch, batch_id)
        except BaseException as exc:
            self.failure, self.failed_epoch = exc, batch_id
            raise

    def _commit(self, batch: Any, batch_id: int) -> None:
        cycle = self.driver.current()  # its sinks and name; Driver.run starts it
        stats = BatchStats(batch_id)
        self.history.append(stats)
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
            began = time.perf_counter()
            staged = self.stager.stage(cycle, batch, batch_id, transforms, run_folder, stats)
            staged_at = time.perf_counter()
            stats.stage_ms = round((staged_at - began) * 1000, 1)
            hooks.point(BATCH_STAGED)
            self._record_offsets(cycle, batch_id)
            self.driver.run(batch_id, outputs_of(cycle.pipeline, batch_id, staged))
            stats.commit_ms = round((time.perf_counter() - staged_at) * 1000, 1)
            result = self.report.results[-1] if self.report.results else None
            stats.replayed = isinstance(result, CommitSucceeded) and result.replayed
            hooks.point(BATCH_COMMITTED)
        finally:
            # This run's files are needed by nothing once run() returned or
            # raised: a re-run of the batch stages its own. (Its rows in a
            # staging table stay until a batch commits: run() may still have
            # been mid-commit, and only the next success proves it is done.)
            shutil.rmtree(run_folder, ignore_errors=True)
        self.stager.sweep(cycle.pipeline, batch_id)

    def _record_offsets(self, cycle: CommitCycle, batch_id: int) -> None:
        """Keep the batch's Kafka offsets in the store, before its epoch can be decided.

        A rebuild replays a Kafka-fed epoch from them (``reconcile.spark.replay``):
        recorded before the decision, every decided epoch has them. A stream of
        another source, or a pipeline without an expected state, records nothing.
        """
        if self.checkpoint is None or cycle.expected_state is None:
            return
        ranges = batch_offsets(self.checkpoint, batch_id)
        if ranges is not None:
            SourceOffsets(cycle.expected_state.root, cycle.pipeline).record(batch_id, ranges)

    def close(self) -> None:
        """Wait for the last batch's sweep, and close the cycle's sinks (the query has stopped)."""
        self.stager.close()
        self.driver.close()


def write_stream(
    df: Any,
    build: Callable[[], CommitCycle],
    *,
    started: tuple[CommitCycle, Iterable[int]] | None = None,
    **options: Unpack[StreamKeywords],
) -> Any:
    """Start a streaming query that writes ``df`` exactly once through ``build()``'s cycle.

    Args:
        df: a streaming DataFrame.
        build: makes the pipeline's CommitCycle (sinks, and an expected state).
        started: (a cycle built by ``build`` and started, its start report's
            ``replay_needed``): the writer goes on with it instead of starting
            one at the first micro-batch (a standby that took over started it
            to fence the old main and converge the sinks first).
        **options: the keywords of :class:`~reconcile.spark.options.StreamOptions`:
            ``checkpoint`` and ``staging`` (required), ``outputs``, ``trigger``,
            ``query_name``, ``retry``, ``via``, ``collect_max_bytes``.

    Returns:
        The started ``StreamingQuery``; its ``reconcile_writer`` attribute is
        the StreamWriter (its report, its last batch's stats).

    Raises:
        InvalidInputError: ``df`` is not a streaming DataFrame.
    """
    return start_query(df, build, StreamOptions(**options), started=started)


def start_query(
    df: Any,
    build: Callable[[], CommitCycle],
    options: StreamOptions,
    *,
    started: tuple[CommitCycle, Iterable[int]] | None = None,
) -> Any:
    """``write_stream`` with its options as one value (what ``HaNode`` calls)."""
    if not getattr(df, "isStreaming", False):
        raise InvalidInputError(
            "write_stream() takes a streaming DataFrame (spark.readStream...); for a batch "
            "DataFrame, run its epochs with reconcile.drive"
        )
    limit = COLLECT_MAX_BYTES if options.collect_max_bytes is None else options.collect_max_bytes
    writer = StreamWriter(build, options.outputs, staging=options.staging, retry=options.retry,
                          via=options.via, collect_max_bytes=limit,
                          checkpoint=options.checkpoint)  # fmt: skip
    if started is not None:
        writer.driver.adopt(*started)
    checkpoint = os.fspath(options.checkpoint)
    stream = df.writeStream.foreachBatch(writer).option("checkpointLocation", checkpoint)
    if options.trigger:
        stream = stream.trigger(**options.trigger)
    if options.query_name:
        stream = stream.queryName(options.query_name)
    query = stream.start()
    query.reconcile_writer = writer
    return query
