"""Where a micro-batch's rows wait between the executors and the commit: three ways.

**Collected** (``collect_rows``), for a micro-batch Spark sizes as small:
Spark's own Arrow collect brings the sink's rows to the driver, with no
Python in the tasks and nothing written on the way; the commit cycle gets
them as one Arrow table. ``estimated_bytes`` is the size Spark's optimizer
gives the batch, the figure it also decides broadcast joins by.

**Through the store and a Postgres staging table** (``stage_on_executors``),
for a Postgres sink with an expected state: each executor task nets its
partition (the batch is split by the sink's key first, so every key is in one
task), writes the net rows as one change file of the store, and COPYs them
into the sink's staging table, tagged with the epoch and a task-attempt id of
its own. Only the file name, the attempt id and counts reach the driver, whose
commit adds the files in one tokened store commit and upserts the attempts'
rows into the target in the sink's epoch txn. No row passes through the driver.

**Through files the driver reads** (``stage_batches`` / ``read_staged``), for
every other sink: each task writes its partition as an Arrow IPC file in a
staging folder; the driver memory-maps the files the kept attempts name and
hands the rows to the commit cycle. The batch's rows pass through the driver's
memory (not through Spark's collect, nor the JVM).

Every way, a retried or speculative task attempt writes (or returns) under a
name of its own, and the driver takes only what the attempts Spark kept
returned: no partition counts twice.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import uuid
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]

from expected_state.parts import PartWriter
from reconcile.core import hooks
from reconcile.core.contract import FatalError
from reconcile.core.staged import SharedStage, StagedEpoch, StageUnavailable, has_shared_stage
from reconcile.engine.cycle import CommitCycle
from reconcile.spark.hashing import row_hash_column

__all__ = [
    "COLLECT_MAX_BYTES",
    "PARTITION_STAGED",
    "VIAS",
    "ColumnsAhead",
    "StagePlan",
    "collect_rows",
    "driver_result_limit",
    "estimated_bytes",
    "plan_stage",
    "read_staged",
    "remove_run_folders",
    "stage_batches",
    "stage_on_executors",
    "stage_to_files",
]

# Inside an executor's task: its partition is staged (file written and
# closed, or rows COPied and committed), and the task has not yet returned it
# (a task killed here leaves staged rows no one names).
PARTITION_STAGED = hooks.declare("stream.partition_staged")

log = logging.getLogger("reconcile.spark.staging")

VIAS = ("auto", "executors", "driver")
# The column the executor path's tasks receive the store's row hash in, computed by Spark.
ROW_HASH_STAGED = "_reconcile_row_hash"
# via="auto": a micro-batch whose input Spark estimates at most this is
# collected to the driver. Spark's estimate of a file source is its bytes on
# disk, a few times less than the rows in memory; a source Spark cannot size
# gets its default estimate (8 EiB), and so the executors.
COLLECT_MAX_BYTES = 16 * 2**20

STAGED_SCHEMA = "path string, rows long"
PARTS_SCHEMA = "path string, task string, upserted long, deleted long"
_PARTS_ARROW = pa.schema(
    [("path", pa.string()), ("task", pa.string()), ("upserted", pa.int64()),
     ("deleted", pa.int64())]
)  # fmt: skip


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


def remove_run_folders(root: str, batch_id: int) -> None:
    """Remove the staging folders (``e<batch>-<run>``) under ``root`` of batches up to ``batch_id``.

    A dead driver's folders among them: nothing reads a batch's files once a
    later batch has committed.
    """
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return
    for name in names:
        if name.startswith("e") and name[1:13].isdigit() and int(name[1:13]) <= batch_id:
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)


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


def arrow_schema(frame: Any) -> pa.Schema:
    """A DataFrame's schema as Arrow, timestamps in the session's time zone."""
    from pyspark.sql.pandas.types import to_arrow_schema

    tz = frame.sparkSession.conf.get("spark.sql.session.timeZone")
    return to_arrow_schema(frame.schema, timezone=tz)


def estimated_bytes(frame: Any) -> int | None:
    """Spark's estimate of ``frame``'s size in bytes (its optimizer's); None if it gives none.

    For files it is their size on disk; a source without statistics gets
    ``spark.sql.defaultSizeInBytes`` (8 EiB unless set), which no collect
    threshold admits.
    """
    try:
        return int(frame._jdf.queryExecution().optimizedPlan().stats().sizeInBytes())
    except Exception as exc:  # a plan Spark cannot size: treat it as large
        log.debug("no size estimate for a micro-batch: %s", exc)
        return None


def driver_result_limit(session: Any) -> int:
    """``spark.driver.maxResultSize`` in bytes (0: no limit), as Spark reads it at every job."""
    conf = session.sparkContext._jsc.sc().conf()
    return int(conf.getSizeAsBytes("spark.driver.maxResultSize", "1g"))


def collect_rows(frame: Any, *, batch_id: int, sink: str) -> pa.Table | None:
    """``frame``'s rows on the driver by Spark's Arrow collect, or None if too big to collect.

    None when the collect ran over ``spark.driver.maxResultSize``: Spark
    aborts the job once the tasks' results pass it, and the caller stages
    the batch another way. That limit is the only guard of the driver's
    memory here, so keep it below what the driver can hold. Any other
    failure is raised.
    """
    try:
        table = frame.toArrow()
    except Exception as exc:
        said = [line for line in str(exc).splitlines() if "spark.driver.maxResultSize" in line]
        if not said:
            raise
        log.warning("micro-batch %d, sink %r: too large to collect (%s); staged another way "
                    "instead", batch_id, sink, said[0].strip()[-300:])  # fmt: skip
        return None
    # toArrow() labels timestamps UTC; the other ways use the session's zone.
    schema = arrow_schema(frame)
    return table if table.schema.equals(schema) else table.cast(schema)


def stage_to_files(frame: Any, folder: str, *, batch_id: int, sink: str) -> tuple[pa.Table, int]:
    """Have the executors stage ``frame`` as files in ``folder``; the rows, and the file count."""
    written = frame.mapInArrow(functools.partial(_stage_partition, folder), STAGED_SCHEMA).collect()
    paths = [row["path"] for row in written]
    rows = sum(int(row["rows"]) for row in written)
    return read_staged(paths, rows, arrow_schema(frame), batch_id=batch_id, sink=sink), len(paths)


@dataclass(frozen=True)
class StagePlan:
    """How the executors stage one sink's rows (it pickles into every task)."""

    sink: str
    writer: PartWriter
    stage: SharedStage  # the sink's staging table (its connection's password travels with it)
    # Spark computes the store's row hash beside the rows, after these casts
    # (column -> Spark type; see hashed_by_spark); None: the tasks hash.
    spark_hash: dict[str, str] | None = None


class ColumnsAhead(Exception):
    """The micro-batch brings columns the target (or its store table) lacks: not staged here yet."""


def plan_stage(cycle: CommitCycle, sink: str, frame: Any) -> StagePlan | None:
    """The executor path for ``sink``, or None if its rows must go through the driver.

    The executor path needs a sink whose capabilities say ``shared_stage``
    (Postgres, either mode) whose key is the sink's key in the expected state,
    and upserts only (no ``_op`` column): deletes and other sinks take the
    driver path. So does a sink whose staging table cannot be used safely
    (see ``sinks.objects.stages.open_stage``), with a warning that says why.

    Raises:
        ColumnsAhead: the frame has a column the target table or its store
            table lacks (a schema change, which the driver's way makes); not
            a plan to keep.
        InvalidInputError: the frame lacks a key column; nothing was staged.
    """
    client: object = cycle.sinks.get(sink)
    expected = cycle.expected_state
    if not has_shared_stage(client) or expected is None or sink not in expected.tables:
        return None
    if client.append_only or "_op" in frame.columns:
        return None
    store = expected.tables[sink]
    table = client.stage_target()
    if list(table.key) != list(store.key_columns):
        return None  # the sink nets by another key than the store: the driver path checks it
    stored = store.current_schema()
    new = [c for c in frame.columns
           if c not in table.columns or (stored is not None and c not in stored.names)]  # fmt: skip
    if new:
        # A schema change: the epoch adds the columns to the table (in its txn,
        # after the fence check) and to the store, which only the driver's way
        # does; the staging table has the target's columns, so it could not
        # take them before. This batch goes the driver's way, the next ones
        # are staged here again once the columns are there.
        lacking = f"table {table.display}" if set(new) - set(table.columns) else "its store"
        raise ColumnsAhead(
            f"pipeline {cycle.pipeline}, sink {sink!r}: the micro-batch brings column(s) {new}, "
            f"which {lacking} lacks: it goes the driver's way, whose epoch adds them; the next "
            "micro-batches are staged on the executors again"
        )
    try:
        stage = table.open_stage(cycle.pipeline)
    except StageUnavailable as exc:
        # Planned once per query run (the caller keeps the None): said once.
        log.warning("pipeline %s: the executor path of sink %r cannot be used safely, so "
                    "its micro-batches go through the driver: %s", cycle.pipeline, sink,
                    exc)  # fmt: skip
        return None
    if store.user_schema is None and store.column_types is None:
        # The first batch plans before the cycle has bound its sinks (start()
        # reads their types): a store table created here takes the sink's
        # types, as one the cycle creates would, not the frame's (an int frame
        # into a bigint column would make a store that start() then refuses).
        store.column_types = table.arrow_schema()
    writer = store.part_writer(arrow_schema(frame))
    return StagePlan(sink, writer, stage, hashed_by_spark(frame, writer.user_schema))


def hashed_by_spark(frame: Any, user: pa.Schema) -> dict[str, str] | None:
    """The casts after which Spark's own row hash of ``frame`` is the store's; None: none do.

    The canonical hash depends on the declared types (``reconcile.core.hashing``),
    and Spark's ``xxhash64`` (``reconcile.spark.hashing.row_hash_column``) gives
    the same number as the store's hash of the same values of the same types.
    A column of the store's very type needs nothing; one that the store
    widens exactly (an integer into a wider one, a decimal into more digits of
    the same scale: the values do not change) is cast in Spark first, so that
    the tasks receive the rows as the store holds them and the hash Spark
    computed in the JVM. Any other difference (a cast that may change a value)
    keeps the hash in Python, computed on the values as stored.

    Returns:
        Column -> the Spark type to cast it to (empty: none), or None.
    """
    types = {f.name: f.type for f in arrow_schema(frame)}
    if ROW_HASH_STAGED in types:
        return None
    casts = {}
    for field in user:
        have = types.get(field.name)
        if have is None:
            return None
        if have != field.type:
            if not _exact_widening(have, field.type):
                return None
            casts[field.name] = _spark_type(field.type)
    return casts


_INTEGERS = (pa.int8(), pa.int16(), pa.int32(), pa.int64())
_SPARK_INTEGERS = {pa.int16(): "smallint", pa.int32(): "int", pa.int64(): "bigint"}


def _exact_widening(have: pa.DataType, want: pa.DataType) -> bool:
    """Whether every value of ``have`` is the same value in ``want`` (in Arrow and in Spark)."""
    if have in _INTEGERS and want in _INTEGERS:
        return _INTEGERS.index(want) > _INTEGERS.index(have)
    if not (pa.types.is_decimal128(have) and pa.types.is_decimal128(want)):
        return False
    return bool(have.scale == want.scale and want.precision > have.precision)


def _spark_type(arrow: pa.DataType) -> str:
    if pa.types.is_decimal(arrow):
        return f"decimal({arrow.precision},{arrow.scale})"
    return _SPARK_INTEGERS[arrow]


def _stage_part(
    plan: StagePlan, epoch: int, batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """``mapInArrow``'s function on the executor path: net, write the store part, COPY."""
    received = list(batches)
    if not received:
        return
    rows = pa.Table.from_batches(received)
    hashes = None
    if ROW_HASH_STAGED in rows.column_names:
        hashes = rows.column(ROW_HASH_STAGED)
        rows = rows.drop_columns([ROW_HASH_STAGED])
    net = plan.writer.net(rows)
    if hashes is not None and not _same_rows(net.upserts, rows, plan.writer.keys):
        hashes = None  # a key repeated in the partition: the net rows are others; hash them here
    task = uuid.uuid4().hex  # this attempt's: a retry or a speculative copy has its own
    # The store's change file (row hashes, Parquet) and the COPY into the staging
    # table need nothing of each other: written side by side, the task takes the
    # longer of the two, not their sum. A failure of either fails the task; the
    # attempt is then never named, and what it wrote is swept or vacuumed.
    with ThreadPoolExecutor(1, thread_name_prefix="reconcile-store-part") as store_part:
        written = store_part.submit(plan.writer.write, epoch, net, hashes)
        if net.upserts.num_rows:
            plan.stage.copy(epoch, task, net.upserts)
        path = written.result()
    hooks.point(PARTITION_STAGED)
    yield pa.RecordBatch.from_pydict(
        {
            "path": [path or ""],
            "task": [task],
            "upserted": [net.upserts.num_rows],
            "deleted": [net.deletes.num_rows],
        },
        schema=_PARTS_ARROW,
    )


def _same_rows(net: pa.Table, received: pa.Table, keys: Sequence[str]) -> bool:
    """Whether the net upserts are the received rows, one for one and in order.

    Netting keeps one row per key: with as many rows as received, and the same
    key in every position, no row was dropped or moved (the keys are distinct).
    """
    if net.num_rows != received.num_rows:
        return False
    return all(net.column(k).equals(received.column(k)) for k in keys)


def stage_on_executors(frame: Any, plan: StagePlan, epoch: int) -> StagedEpoch:
    """Have the executors stage ``frame`` for ``plan``'s sink; what the commit needs of it."""
    from pyspark.sql import functions as F

    if plan.spark_hash is not None:
        casts = plan.spark_hash
        names = plan.writer.user_schema.names
        frame = frame.select(
            *[F.col(c).cast(casts[c]).alias(c) if c in casts else F.col(c) for c in frame.columns]
        )
        frame = frame.withColumn(ROW_HASH_STAGED, row_hash_column(names, frame.schema))
    by_key = frame.repartition(*[F.col(k) for k in plan.writer.keys])
    kept = by_key.mapInArrow(functools.partial(_stage_part, plan, epoch), PARTS_SCHEMA).collect()
    upserted = sum(int(row["upserted"]) for row in kept)
    return StagedEpoch(
        sink=plan.sink,
        epoch=epoch,
        columns=tuple(plan.writer.user_schema.names),
        stage=plan.stage.table,
        tasks=tuple(row["task"] for row in kept),
        rows=upserted,  # every staged row is an upsert on this path
        store_files=tuple(row["path"] for row in kept if row["path"]),
        upserted=upserted,
        deleted=sum(int(row["deleted"]) for row in kept),
    )
