"""``reconcile run`` for a pipeline under Real-Time Mode: lead by the lease, write through markers.

A run table with ``realtime`` (``reconcile.cli.config_run``) streams the app's
Kafka-fed frame into the pipeline's one PostgreSQL sink with
``reconcile.spark.realtime.start_realtime``: small transactions inside long
batches, each carrying its topic-partitions' offset markers, so a replayed
record lands once. The frame carries the Kafka source's ``topic``,
``partition`` and ``offset``; every other column of it is a column of the table.

Main and standby take the same lease as the micro-batch runs (``reconcile.ha``):
only its holder runs the query, and it renews the lease every quarter term.
A holder that cannot renew stops its query and waits as a standby. The lease
keeps two drivers from both streaming; what it cannot stop (a driver paused past
its term, whose tasks still write) the markers' generations fence inside the
database: a task of an older generation is refused in its own transaction.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from reconcile.cli.config import PipelineConfig, RunSettings
from reconcile.cli.config_sinks import split_table
from reconcile.core.lease import Lease, wait_s

__all__ = ["realtime_target", "run_realtime"]

log = logging.getLogger("reconcile.run")

POLL_S = 1.0  # how often a waiting node asks for the lease again, at most


def realtime_target(pipeline: PipelineConfig, frame_columns: list[str]) -> Any:
    """The pipeline's one sink as a ``RealtimeTarget``, its columns the frame's but Kafka's."""
    from reconcile.spark.realtime import OFFSET_COLUMNS
    from sinks.realtime import RealtimeTarget

    (sink,) = pipeline.sinks  # one sink: config_run refuses any other count
    schema, table = split_table(sink.table)
    columns = tuple(c for c in frame_columns if c not in OFFSET_COLUMNS)
    return RealtimeTarget(
        sink.connection.get_secret_value(),
        table,
        columns,
        pipeline.name,
        sink.name,
        **({"schema": schema} if schema else {}),
    )


def run_realtime(
    pipeline: PipelineConfig, settings: RunSettings, df: Any, lease: Lease, stop: threading.Event
) -> bool:
    """Lead by ``lease`` and stream ``df`` until ``stop``; whether the query finished on its own.

    Raises:
        StreamingQueryException: the query failed (a task failed past Spark's retries).
    """
    from reconcile.spark.realtime import start_realtime

    target = realtime_target(pipeline, list(df.columns))
    while not stop.is_set():
        if lease.try_acquire() is None or lease.tenure is None:
            stop.wait(max(wait_s(lease.current(), POLL_S), 0.05))
            continue
        log.info("pipeline %s: leading (tenure %s): Real-Time Mode, batches of %s, %s writer",
                 pipeline.name, lease.tenure, settings.realtime, settings.writer,
                 extra={"pipeline": pipeline.name})  # fmt: skip
        query = start_realtime(
            df,
            target,
            checkpoint=settings.checkpoint,
            batch=settings.realtime or "5 seconds",
            rows_per_txn=settings.rows_per_txn,
            ms_per_txn=settings.ms_per_txn,
            query_name=f"reconcile_{pipeline.name}",
            writer=settings.writer,
        )
        try:
            if _lead(pipeline, lease, query, stop):
                return True
        finally:
            if query.isActive:
                query.stop()
    return False


def _lead(pipeline: PipelineConfig, lease: Lease, query: Any, stop: threading.Event) -> bool:
    """Renew the lease while ``query`` runs; True when the query ended by itself."""
    while not stop.wait(lease.term_s / 4):
        if not query.isActive:
            failure = query.exception()
            if failure is not None:
                raise failure
            return True
        try:
            renewed = lease.renew()
        except Exception:  # the lease's database away: its own clock decides
            log.warning("pipeline %s: the lease could not be renewed", pipeline.name,
                        exc_info=True, extra={"pipeline": pipeline.name})  # fmt: skip
            renewed = lease.held()
        if not renewed:
            # WHY stop rather than go on: another node may take the lease now. Our tasks
            # that still run are fenced by the markers' generations once it starts.
            log.warning("pipeline %s: lost the lease; the query stops, waiting as a standby",
                        pipeline.name, extra={"pipeline": pipeline.name})  # fmt: skip
            return False
    return False
