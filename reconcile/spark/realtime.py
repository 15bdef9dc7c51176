"""Exactly-once from Kafka into PostgreSQL under Spark's Real-Time Mode, through ``foreach``.

Real-Time Mode (``trigger(realTime=...)``) runs long batches whose tasks
process rows as the Kafka source hands them over; it accepts neither
``foreachBatch`` nor Python data source sinks, and on its own it is
at-least-once: a failed batch runs again from its start offsets. Here a
``foreach`` writer commits to PostgreSQL in small transactions inside the long
batch (every ``rows_per_txn`` rows, or when ``ms_per_txn`` has passed at the
next row, and at the end of the task), each carrying its topic-partitions'
offset markers (the backend's ``realtime`` capability, PostgreSQL's in
``sinks.postgres.realtime``): a replayed record at or below
its marker is skipped, and a task of an older generation is fenced.

The writer is the JVM's (``writer="jvm"``, the default: ``io.reconcile.realtime.MarkerWriter``
from ``jvm/realtime-writer``, the same transactions in Java, with a timer that commits
when ``ms_per_txn`` has passed even if no row follows), or Python's (``writer="python"``,
:class:`RealtimeForeachWriter`). Rows reach a Python ``foreach`` writer in bursts, bounded
by the batch; they reach a JVM one as they arrive (docs/realtime.md has the figures).

Only plans without state are taken: an aggregation, a join, a deduplication
or a window would make a replayed row's output depend on what else the
replay saw, which an offset marker cannot vouch for; they are refused by name.
"""

from __future__ import annotations

import time
from typing import Any

from reconcile.core import hooks
from reconcile.core.contract import ConfigurationError
from reconcile.spark.checkpoint import clear_interrupted_writes
from reconcile.spark.jars import REALTIME_GROUP, require
from sinks import registry
from sinks.base import REALTIME, REALTIME_JDBC
from sinks.objects.declared import REALTIME_OFFSETS
from sinks.realtime import OffsetRecord, RealtimeTarget, RealtimeWriter

__all__ = [
    "JVM_WRITER",
    "MULTIPLYING_NODES",
    "OFFSET_COLUMNS",
    "REFUSED_NODES",
    "WRITERS",
    "RealtimeForeachWriter",
    "check_realtime_plan",
    "jvm_writer",
    "start_realtime",
]

# The Kafka source's columns that place a row: every row must carry them.
OFFSET_COLUMNS = ("topic", "partition", "offset")
# Logical plan nodes whose output for a record depends on other records (state).
REFUSED_NODES = frozenset(
    {
        "Aggregate",
        "Join",
        "Deduplicate",
        "DeduplicateWithinWatermark",
        "Distinct",
        "Window",
        "FlatMapGroupsWithState",
        "FlatMapGroupsInPandasWithState",
        "TransformWithState",
        "TransformWithStateInPySpark",
    }
)

# Logical plan nodes that may make several output rows of one record, or one row of
# several: the writer commits in small transactions and a marker covers a record's
# offset once a transaction with one of its rows commits, so the replay would skip the
# rest of a record split across two transactions. One record, at most one row.
MULTIPLYING_NODES = frozenset(
    {
        "Generate",
        "Expand",
        "MapInPandas",
        "MapInArrow",
        "PythonMapInArrow",
        "MapPartitions",
        "MapPartitionsInR",
        "MapPartitionsInRWithArrow",
        "MapGroups",
        "FlatMapGroupsInArrow",
        "FlatMapGroupsInR",
        "FlatMapCoGroupsInPandas",
        "FlatMapCoGroupsInArrow",
        "CoGroup",
    }
)

TXN_COMMITTED = hooks.declare("realtime.txn_committed")
# The JVM writer's class (jvm/realtime-writer), and the writers start_realtime takes.
JVM_WRITER = "io.reconcile.realtime.MarkerWriter"
WRITERS = ("jvm", "python")
# The Kafka source's types of its placing columns, which the JVM writer reads as such.
OFFSET_TYPES = {"topic": "string", "partition": "int", "offset": "bigint"}


def _plan_nodes(plan: Any) -> list[str]:
    """The class names of a JVM logical plan's nodes, depth first."""
    names = [str(plan.getClass().getSimpleName())]
    children = plan.children()
    for i in range(children.size()):
        names += _plan_nodes(children.apply(i))
    return names


def check_realtime_plan(frame: Any, columns: tuple[str, ...]) -> None:
    """Refuse a plan the offset markers cannot make exactly-once.

    Raises:
        ConfigurationError: the frame is not streaming, has a stateful node
            (named), or lacks a column (named).
    """
    if not frame.isStreaming:
        raise ConfigurationError("real-time sink: the frame is not streaming (readStream)")
    nodes = set(_plan_nodes(frame._jdf.queryExecution().analyzed()))
    refused = sorted(nodes & REFUSED_NODES)
    if refused:
        raise ConfigurationError(
            f"real-time sink: the plan has {', '.join(refused)}, which keeps state across "
            "records; a replayed record's output would then depend on what else the replay "
            "read, which per-partition offset markers cannot vouch for. Only per-record plans "
            "(select, filter, projections) are taken",
            refused=refused,
        )
    multiplying = sorted(nodes & MULTIPLYING_NODES)
    if multiplying:
        raise ConfigurationError(
            f"real-time sink: the plan has {', '.join(multiplying)}, which may make several "
            "rows of one record (or one of several); each record's offset is marked written "
            "once a transaction holding one of its rows commits, so a replay would skip the "
            "rest. Only plans that map one record to at most one row are taken",
            refused=multiplying,
        )
    missing = [c for c in (*OFFSET_COLUMNS, *columns) if c not in frame.columns]
    if missing:
        raise ConfigurationError(
            f"real-time sink: the frame has no column {', '.join(missing)}; it needs the "
            f"Kafka source's {', '.join(OFFSET_COLUMNS)} and the target's columns",
            missing=missing,
        )


def check_txn_bounds(target: RealtimeTarget, rows_per_txn: int, ms_per_txn: int) -> None:
    """Refuse transaction bounds no writer can keep (either writer, before it starts)."""
    if rows_per_txn < 1 or ms_per_txn < 0:
        raise ConfigurationError(
            f"real-time sink {target.sink}: rows_per_txn must be >= 1 and ms_per_txn >= 0, "
            f"got {rows_per_txn} and {ms_per_txn}"
        )


class RealtimeForeachWriter:
    """The ``foreach`` writer: one per task, small transactions with offset markers.

    Args:
        target: the table, its columns and the marker names (picklable).
        rows_per_txn: commit once this many rows are buffered.
        ms_per_txn: commit at the next row once the oldest buffered row is this old.
    """

    def __init__(self, target: RealtimeTarget, rows_per_txn: int, ms_per_txn: int) -> None:
        check_txn_bounds(target, rows_per_txn, ms_per_txn)
        self.target = target
        self.rows_per_txn = rows_per_txn
        self.ms_per_txn = ms_per_txn
        self.txn: RealtimeWriter | None = None
        self.buffer: list[OffsetRecord] = []
        self.since = 0.0

    def open(self, partition_id: int, epoch_id: int) -> bool:
        """Connect and bind the marker table; always True (every batch is written)."""
        # Always True: the epoch alone cannot say what is written (a batch is
        # long and committed in parts), the markers say it row by row.
        self.txn = registry.capability(self.target.dsn, REALTIME)(self.target)
        self.buffer = []
        return True

    def process(self, row: Any) -> None:
        """Buffer one row; commit the buffer when it is full or old enough."""
        values = tuple(row[c] for c in self.target.columns)
        if not self.buffer:
            self.since = time.monotonic()
        self.buffer.append(OffsetRecord(row["topic"], row["partition"], row["offset"], values))
        old = (time.monotonic() - self.since) * 1000 >= self.ms_per_txn
        if len(self.buffer) >= self.rows_per_txn or old:
            self._flush()

    def _flush(self) -> None:
        if self.buffer and self.txn is not None:
            self.txn.commit(self.buffer)
            self.buffer = []
            hooks.point(TXN_COMMITTED)

    def close(self, error: BaseException | None) -> None:
        """Commit what is buffered unless the task failed; disconnect."""
        try:
            # A failed task's buffer is dropped, not committed: Spark runs the batch
            # again from its start offsets, and the replay writes these rows then
            # (the markers skip only what was committed).
            if error is None:
                self._flush()
        finally:
            if self.txn is not None:
                self.txn.close()


def start_realtime(
    frame: Any,
    target: RealtimeTarget,
    *,
    checkpoint: str,
    batch: str = "5 seconds",
    rows_per_txn: int = 100,
    ms_per_txn: int = 100,
    query_name: str | None = None,
    writer: str = "jvm",
) -> Any:
    """Start ``frame`` (from Spark's Kafka source) into ``target`` under Real-Time Mode.

    Args:
        frame: a streaming frame with the Kafka source's ``topic``, ``partition``,
            ``offset`` and the target's columns, and no stateful operator.
        target: the table, its columns, the pipeline and sink names.
        checkpoint: the query's checkpoint location.
        batch: Real-Time Mode's batch duration (``trigger(realTime=batch)``).
        rows_per_txn: commit every this many rows.
        ms_per_txn: or once the oldest buffered row is this old (the JVM writer's
            timer commits then; the Python writer checks at the next row).
        query_name: the streaming query's name.
        writer: ``"jvm"`` (rows written as they arrive; needs ``scripts/fetch-jars``'s
            build on the session's ``spark.jars``) or ``"python"`` (rows in bursts).

    Returns:
        The started ``StreamingQuery``.

    Raises:
        ConfigurationError: the plan is refused (see :func:`check_realtime_plan`), the
            transaction bounds are out of range, the writer is unknown, or the JVM writer
            is not on the session's classpath.
    """
    if writer not in WRITERS:
        raise ConfigurationError(
            f"real-time sink {target.sink}: writer must be one of {', '.join(WRITERS)}, "
            f"got {writer!r}"
        )
    # Before anything is created or cleared: refused bounds leave nothing behind.
    check_txn_bounds(target, rows_per_txn, ms_per_txn)
    check_realtime_plan(frame, target.columns)
    # Bound on the driver before any task runs: the marker table is created and
    # checked once here, so a refused table stops the query before it writes a row.
    bound = registry.capability(target.dsn, REALTIME)(target)
    try:
        # The JVM writer's tasks cannot run the checks: they require the catalog facts
        # vetted here (the Python writer's tasks run the checks themselves).
        marker_check = bound.marker_check() if writer == "jvm" else None
    finally:
        bound.close()
    # A driver killed inside its checkpoint write would leave Spark refusing every restart.
    clear_interrupted_writes(frame.sparkSession, checkpoint)
    if marker_check is not None:
        return _start_jvm(
            frame, target, checkpoint, batch, rows_per_txn, ms_per_txn, query_name, marker_check
        )
    stream = frame.writeStream.outputMode("update")  # the only mode Real-Time Mode takes
    if query_name is not None:
        stream = stream.queryName(query_name)
    return (
        stream.foreach(RealtimeForeachWriter(target, rows_per_txn, ms_per_txn))
        .option("checkpointLocation", checkpoint)
        .trigger(realTime=batch)
        .start()
    )


def jvm_writer(
    frame: Any,
    target: RealtimeTarget,
    rows_per_txn: int,
    ms_per_txn: int,
    marker_check: tuple[str, str],
) -> Any:
    """The JVM ``ForeachWriter`` of ``frame``'s rows into ``target`` (a py4j object).

    ``marker_check`` is the writer's ``marker_check()`` on the driver: the query each
    task runs on the marker table in ``open()``, and the answer it requires.

    Raises:
        ConfigurationError: the class is not on the session's classpath, a Kafka column
            has another type than the source's, or the DSN cannot be given to JDBC.
    """
    what = f"real-time sink {target.sink}"
    require(REALTIME_GROUP, f"{what} (writer='jvm')")
    jvm = frame.sparkSession._jvm
    found = jvm
    for part in JVM_WRITER.split("."):
        found = getattr(found, part)
    if type(found).__name__ != "JavaClass":  # py4j names an unknown class a JavaPackage
        raise ConfigurationError(
            f"{what}: the JVM writer {JVM_WRITER} is not on this session's classpath; its "
            "JARs must be in spark.jars when the session starts (reconcile.spark.session."
            "local_session puts them there), or use writer='python'"
        )
    types = dict(frame.dtypes)
    wrong = [f"{c} is {types[c]}" for c, t in OFFSET_TYPES.items() if types.get(c) != t]
    if wrong:
        raise ConfigurationError(
            f"{what}: the Kafka columns must keep the source's types "
            f"({', '.join(f'{c} {t}' for c, t in OFFSET_TYPES.items())}); {', '.join(wrong)}"
        )
    url, properties = registry.capability(target.dsn, REALTIME_JDBC)(target.dsn, what)
    indices = [frame.columns.index(c) for c in (*OFFSET_COLUMNS, *target.columns)]
    return found(
        url, properties, target.schema, target.table, list(target.columns), target.pipeline,
        target.sink, target.state_schema, REALTIME_OFFSETS.name, indices, rows_per_txn,
        ms_per_txn, *marker_check,
    )  # fmt: skip


def _start_jvm(
    frame: Any,
    target: RealtimeTarget,
    checkpoint: str,
    batch: str,
    rows_per_txn: int,
    ms_per_txn: int,
    query_name: str | None,
    marker_check: tuple[str, str],
) -> Any:
    """Start the query with the JVM writer, through the JVM's DataStreamWriter."""
    from pyspark.sql.streaming.query import StreamingQuery

    jvm = frame.sparkSession._jvm
    stream = frame._jdf.writeStream().outputMode("update")
    if query_name is not None:
        stream = stream.queryName(query_name)
    query = (
        stream.foreach(jvm_writer(frame, target, rows_per_txn, ms_per_txn, marker_check))
        .option("checkpointLocation", checkpoint)
        .trigger(jvm.org.apache.spark.sql.streaming.Trigger.RealTime(batch))
        .start()
    )
    return StreamingQuery(query)
