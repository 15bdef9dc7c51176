"""Staging a micro-batch for the commit cycle: every sink's rows collected, on executors, in files.

The streaming writer (``reconcile.spark.stream``) hands each micro-batch to a
:class:`BatchStager`, which picks the way per batch and per sink (``via``),
plans the executor path of a Postgres sink once per query run, stages every
sink's rows side by side, runs the staging again after a transient failure,
and sweeps the staging tables and folders of batches that are committed.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_exponential_jitter

from reconcile.core import hooks
from reconcile.core.contract import ConfigurationError, RetryableError
from reconcile.engine.cycle import CommitCycle
from reconcile.engine.driver import RetryPolicy
from reconcile.spark.outputs import Transform, apply_transform
from reconcile.spark.staging import (
    VIAS,
    ColumnsAhead,
    StagePlan,
    collect_rows,
    driver_result_limit,
    estimated_bytes,
    plan_stage,
    remove_run_folders,
    stage_on_executors,
    stage_to_files,
)

__all__ = ["STAGE_SWEEP", "BatchStager", "BatchStats"]

# The writer's logger: what staging says is said of the stream.
log = logging.getLogger("reconcile.spark.stream")

# On the sweep's own thread, before the staging tables of committed batches are emptied.
STAGE_SWEEP = hooks.declare("stream.stage_sweep")


@dataclass
class BatchStats:
    """What the writer did for one micro-batch (the newest is ``StreamWriter.last``)."""

    batch_id: int
    rows: dict[str, int] = field(default_factory=dict)  # sink -> rows staged
    files: dict[str, int] = field(default_factory=dict)  # sink -> files staged
    # sink -> "collect", "executors", "driver", or "arrow" (the transform's own rows)
    via: dict[str, str] = field(default_factory=dict)
    input_bytes: int | None = None  # Spark's estimate of the batch's input (via="auto")
    replayed: bool = False  # the epoch was already in every sink: nothing was staged
    stage_ms: float | None = None  # the executors' (or the driver's) staging of every sink
    commit_ms: float | None = None  # the commit cycle: store, sinks, markers (retries included)


class BatchStager:
    """How one streaming writer stages its micro-batches (see ``StreamWriter`` for ``via``).

    Args:
        staging: the folder executors stage rows in (absolute).
        via: "auto", "executors" or "driver".
        collect_max_bytes: the largest input estimate ``via="auto"`` collects.
        policy: how long a staging that fails transiently is run again.

    Raises:
        ConfigurationError: an unknown ``via``, a negative ``collect_max_bytes``.
    """

    def __init__(self, staging: str, via: str, collect_max_bytes: int, policy: RetryPolicy) -> None:
        if via not in VIAS:
            raise ConfigurationError(f"via must be one of {list(VIAS)}, got {via!r}")
        if collect_max_bytes < 0:
            raise ConfigurationError(f"collect_max_bytes must be >= 0, got {collect_max_bytes}")
        self.staging, self.via, self.policy = staging, via, policy
        self.collect_max_bytes = collect_max_bytes
        self._may_collect: bool | None = None  # via="auto": decided at the first batch
        self._unsized = False  # a batch without a size estimate was reported
        # Staging-table rows may exist: a dead driver's (before the first
        # batch) or a batch staged on the executors since the last sweep.
        self._sweep_due = True
        # (sink, the frame's schema) -> how its executors stage it (None: via
        # the driver). Planning reads the catalog and the store and creates
        # the staging table: once per query run, not once per micro-batch.
        self._plans: dict[tuple[str, str], StagePlan | None] = {}
        # The staging tables' sweep after a batch, on a thread of its own (see sweep).
        self._sweeping: Future[None] | None = None
        self._sweeper: ThreadPoolExecutor | None = None

    def _stage(
        self,
        cycle: CommitCycle,
        batch: Any,
        batch_id: int,
        transforms: Mapping[str, Transform],
        run_folder: str,
        stats: BatchStats,
    ) -> dict[str, Any]:
        """Stage every sink's rows (collected, on the executors, or in files): what the cycle gets.

        The sinks' Spark jobs are submitted from one thread each, so that they
        run side by side: a micro-batch's staging costs its slowest sink, not
        the sum (Spark schedules concurrent jobs of one session; nothing is
        recorded or committed until every sink's rows are staged).
        """
        collect = False
        if self.via == "auto" and self._collects(batch):
            stats.input_bytes = estimated_bytes(batch)
            if stats.input_bytes is None and not self._unsized:
                self._unsized = True  # said once: auto would otherwise never collect, silently
                log.warning("pipeline %s: Spark gives no size estimate of micro-batch %d; "
                            "via='auto' stages such batches on the executors",
                            cycle.pipeline, batch_id)  # fmt: skip
            collect = stats.input_bytes is not None and stats.input_bytes <= self.collect_max_bytes

        def stage_one(sink: str, transform: Transform) -> tuple[Any, int, int, str]:
            frame = apply_transform(transform, batch, batch_id, sink=sink)
            if isinstance(frame, pa.Table):  # rows the transform made on the driver
                return frame, frame.num_rows, 0, "arrow"
            # Planned whichever way the batch goes: the target is checked from
            # the first batch on, and its staging table is known, so that a
            # dead driver's staged rows are swept even if every batch of this
            # run is collected.
            plan = self._plan(cycle, sink, frame) if self.via != "driver" else None
            if collect:
                collected = collect_rows(frame, batch_id=batch_id, sink=sink)
                if collected is not None:
                    return collected, collected.num_rows, 0, "collect"
            if plan is not None:
                self._sweep_due = True
                parts = stage_on_executors(frame, plan, batch_id)
                return parts, parts.rows, len(parts.store_files), "executors"
            folder = os.path.join(run_folder, sink)
            table, files = stage_to_files(frame, folder, batch_id=batch_id, sink=sink)
            return table, table.num_rows, files, "driver"

        if len(transforms) == 1:
            done = {sink: stage_one(sink, t) for sink, t in transforms.items()}
        else:
            with ThreadPoolExecutor(len(transforms), thread_name_prefix="stage") as pool:
                futures = {sink: pool.submit(stage_one, sink, t) for sink, t in transforms.items()}
                done = {sink: future.result() for sink, future in futures.items()}
        staged: dict[str, Any] = {}
        for sink, (rows, count, files, via) in done.items():
            staged[sink] = rows
            stats.rows[sink], stats.files[sink], stats.via[sink] = count, files, via
        return staged

    def stage(self, cycle: CommitCycle, *args: Any) -> Any:
        """``_stage``, again after a transient failure, as ``drive`` runs an epoch again.

        Staging writes nothing any epoch reads until the commit cycle takes it
        (files of this run, staging-table rows of this run's task attempts), so
        running it again is safe; a server restarting or a dropped connection
        while the staging table is checked must not fail the query.
        """
        policy = self.policy
        retrying = Retrying(
            retry=retry_if_exception_type(RetryableError),
            stop=stop_after_delay(policy.give_up_after_s),
            wait=wait_exponential_jitter(
                multiplier=policy.initial_s, max=policy.max_s, jitter=policy.jitter_s
            ),
            before_sleep=lambda state: log.warning(
                "pipeline %s: staging micro-batch %s again (attempt %d): %s",
                cycle.pipeline,
                args[1],
                state.attempt_number,
                state.outcome.exception() if state.outcome else None,
            ),
            reraise=True,
        )
        return retrying(self._stage, cycle, *args)

    def _collects(self, batch: Any) -> bool:
        """Whether ``via="auto"`` may collect at all (once per writer; says why not, once)."""
        if self._may_collect is None:
            limit = driver_result_limit(batch.sparkSession)
            self._may_collect = limit > 0
            if not self._may_collect:
                log.warning("spark.driver.maxResultSize is 0 (no limit): via='auto' collects "
                            "nothing, since nothing would stop a collect that outgrows the "
                            "driver; every micro-batch is staged the other ways")  # fmt: skip
        return self._may_collect

    def _plan(self, cycle: CommitCycle, sink: str, frame: Any) -> StagePlan | None:
        """The executor path of ``sink`` for frames of this schema (planned on first use)."""
        key = (sink, frame.schema.json())
        if key not in self._plans:
            try:
                self._plans[key] = plan_stage(cycle, sink, frame)
            except ColumnsAhead as ahead:
                # Not kept: once this batch's epoch has added the columns, the
                # next batch of this schema is planned again, for the executors.
                log.info("%s", ahead)
                return None
        return self._plans[key]

    def sweep(self, pipeline: str, batch_id: int) -> None:
        """Remove staged rows of batches up to ``batch_id``: this one's, and a dead driver's.

        The staging tables' DELETE runs on a thread of its own, while Spark
        runs the next micro-batch: the batch is committed, and nothing reads
        the rows it deletes (the next batch stages and reads rows of a later
        epoch only). The next sweep, and ``close``, wait for it.
        """
        self.settle()
        if self._sweep_due:
            self._sweep_due = False
            planned = {plan.sink: plan for plan in self._plans.values() if plan is not None}
            if self._sweeper is None:
                self._sweeper = ThreadPoolExecutor(1, thread_name_prefix="reconcile-stage-sweep")
            self._sweeping = self._sweeper.submit(self._sweep, pipeline, batch_id, planned)
        remove_run_folders(os.path.join(self.staging, pipeline), batch_id)

    def _sweep(self, pipeline: str, batch_id: int, planned: dict[str, StagePlan]) -> None:
        hooks.point(STAGE_SWEEP)
        for sink, plan in planned.items():
            try:
                plan.stage.sweep(batch_id, "reconcile-stage-sweep")
            except Exception as exc:  # the batch is committed; the next batch tries again
                self._sweep_due = True
                log.warning("pipeline %s: could not empty the staging table of %s: %s",
                            pipeline, sink, exc)  # fmt: skip

    def settle(self) -> None:
        """Wait for a sweep still running (its failures are logged, and tried again)."""
        running, self._sweeping = self._sweeping, None
        if running is not None:
            running.result()

    def close(self) -> None:
        """Wait for a sweep still running, and stop its thread."""
        self.settle()
        if self._sweeper is not None:
            self._sweeper.shutdown(wait=True)
            self._sweeper = None
