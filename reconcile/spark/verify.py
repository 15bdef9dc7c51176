"""Distributed verify and repair on Spark: executors pull key ranges; the diff is a Spark join.

``spark_recover(spark, dsn, store, pipeline, table)`` is full-mode pull-and-diff
for a PostgreSQL sink table too large for one process:

1. the driver opens one REPEATABLE READ snapshot of the sink, exports it
   (``pg_export_snapshot``), reads the sink's newest marker in it, and cuts
   the first key column into ranges of about equal rows (``percentile_disc``);
2. each executor task imports that very snapshot (``SET TRANSACTION
   SNAPSHOT``), so that every range is read from one consistent state, pulls
   its range with COPY into Arrow, and casts it to the expected state's types;
3. the canonical row hash is computed by Spark as a native expression
   (``hashing_spark.row_hash_column``, no Python UDF), and the sink's rows are
   joined by key with the expected state, read from the store's Delta table
   through the bridge (``spark_state.read_state``): missing, extra and
   changed keys are counted by the executors;
4. with ``dry_run=False``, executors apply the difference in bounded
   transactions (``batch_rows`` rows each), each ONE sink transaction with
   its repair record, fenced and re-checked against the newest marker exactly
   as an in-process repair (``sinks.postgres.repair``).

The driver receives counts and a few sample keys only, never rows. A repair
killed midway leaves whole transactions behind: run it again and it finds,
and applies, only what is still missing; nothing is applied twice. A
transaction that finds that an epoch committed since the pull writes nothing
and is counted as ``stale``: run again.

Only the sink's own newest state is compared: the target epoch is the sink's
newest marker (which the store recorded before the sink committed it). A sink
that is behind the store (a pipeline that crashed mid-epoch) is brought to the
store by the pipeline's ``start()`` or an in-process ``reconcile repair``,
which also writes the missing markers; this job refuses to repair it.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass, field, replace
from itertools import pairwise
from typing import Any, Unpack

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]

from expected_state.store import ExpectedStateStore
from reconcile.core import errors, hooks, interrupts
from reconcile.core.conform import _UNCONVERTIBLE, check_columns
from reconcile.core.contract import (
    InvalidInputError,
    MassChangeError,
    validate_name,
)
from reconcile.core.expected import ExpectedStore
from reconcile.core.target import KeyRange, repair_turn
from reconcile.recovery.brake import Brake, BrakeReading, refusal
from reconcile.recovery.diff import Diff
from reconcile.recovery.provenance import Provenance, trace
from reconcile.recovery.report import ReconcileReport
from reconcile.recovery.source import ExpectedSource
from reconcile.spark.hashing import row_hash_column
from reconcile.spark.options import SparkRecoverKeywords, SparkRecoverOptions
from reconcile.spark.store_reader import expected_side, native_reader
from reconcile.spark.tasks import ACTUAL, BAD, HASH, KIND, ApplyJob, PullJob, SinkAt
from reconcile.spark.tasks import apply as apply_task
from reconcile.spark.tasks import pull as pull_task

__all__ = ["SparkReport", "spark_recover"]

log = logging.getLogger("reconcile.spark.verify")

# On the driver: the snapshot is exported and the ranges cut; no executor has
# imported it yet (a test ends the exporting session here).
SNAPSHOT_EXPORTED = hooks.declare("spark.verify.snapshot_exported")
# The last line of a Python traceback that Spark carries back from an executor,
# for an error of the engine's errors module (its name taken from the module, so
# that moving the errors cannot leave the pattern behind).
_RAISED = re.compile(rf"^({re.escape(errors.__name__)}\.[A-Za-z]+): (.*)$", re.M)


def _from_executor(exc: BaseException) -> BaseException:
    """The engine's own error an executor raised, rebuilt with its type and message.

    Spark hands a task's Python exception to the driver as text inside its own
    exception (the task's traceback); an engine error found there is raised as
    itself, so that callers (and the exit codes) see what went wrong, not "a
    Spark job failed".
    """
    found = _RAISED.findall(str(exc))
    if not found:
        return exc
    name, message = found[-1]
    kind = getattr(errors, name.rsplit(".", 1)[1], None)
    if not (isinstance(kind, type) and issubclass(kind, errors.ReconcileError)):
        return exc
    rebuilt: BaseException = kind(f"on an executor: {message}")
    return rebuilt


@dataclass(frozen=True)
class SparkReport(ReconcileReport):
    """A ``ReconcileReport`` with what the Spark job adds.

    Attributes:
        partitions: key ranges pulled in parallel.
        transactions: repair transactions committed (or found stale).
        stale: rows whose repair transaction found an epoch committed since the
            pull (nothing of it written): run the job again.
        samples: up to a few keys per kind (missing, extra, changed).
    """

    partitions: int = 0
    transactions: int = 0
    stale: int = 0
    samples: dict[str, list[dict[str, Any]]] = field(default_factory=dict)


@dataclass
class _JobResult:
    reader: str  # how the expected state was read, as the report's reason says it
    counted: dict[str, int]
    rows_pulled: int
    samples: dict[str, list[dict[str, Any]]]
    applied: int = 0
    stale: int = 0
    transactions: int = 0
    brake: BrakeReading | None = None


def _run_job(
    spark: Any,
    pull: PullJob,
    store: ExpectedStore,
    epoch: int,
    newest: int | None,
    options: SparkRecoverOptions,
    native: bool,
) -> _JobResult:
    """The Spark side: pull, hash, join, count, and (not ``dry_run``) apply from executors."""
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_schema

    schema, keys = pull.store_schema, list(pull.sink.keys or ())
    dry_run, samples, brake = options.dry_run, options.samples, options.brake or Brake()
    pulled_schema = from_arrow_schema(
        schema.append(pa.field(BAD, pa.bool_())), prefer_timestamp_ntz=True
    )
    ids = spark.range(len(pull.ranges), numPartitions=len(pull.ranges))
    pulled = ids.mapInArrow(lambda it: pull_task(pull, it), pulled_schema)
    hashed = row_hash_column(schema.names, pulled.schema)
    # A value that did not convert gets a hash that matches nothing (as in-process).
    flagged = hashed.bitwiseXOR(F.lit(int(_UNCONVERTIBLE)))
    actual = pulled.select(*keys, F.when(F.col(BAD), flagged).otherwise(hashed).alias(ACTUAL))
    expected, result_reader = expected_side(spark, store, keys, epoch, native)
    joined = expected.select(*keys, HASH).join(actual, keys, "full_outer")
    kind = (
        F.when(F.col(ACTUAL).isNull(), F.lit("missing"))
        .when(F.col(HASH).isNull(), F.lit("extra"))
        .when(F.col(HASH) != F.col(ACTUAL), F.lit("changed"))
    )
    # Every key once, classified (None: the same on both sides), kept on the
    # executors: the counts, the samples and the repair read it, not the sink.
    classified = joined.select(
        *keys, kind.alias(KIND), F.col(ACTUAL).isNotNull().alias("_pulled")
    ).persist()
    try:
        figures = (
            classified.groupBy(KIND)
            .agg(F.count(F.lit(1)).alias("n"), F.sum(F.col("_pulled").cast("long")).alias("p"))
            .collect()
        )
        counted = {r[KIND]: int(r["n"]) for r in figures if r[KIND] is not None}
        diff = classified.where(F.col(KIND).isNotNull()).select(*keys, KIND)
        result = _JobResult(
            reader=result_reader,
            counted=counted,
            rows_pulled=sum(int(r["p"] or 0) for r in figures),
            samples={
                k: [
                    r.asDict()
                    for r in diff.where(F.col(KIND) == k).select(*keys).limit(samples).collect()
                ]
                for k in counted
            },
        )
        # The sink is compared at its own newest marker: it catches up on no
        # epoch, so every extra and changed row counts, of every row pulled.
        weighed = counted.get("extra", 0) + counted.get("changed", 0)
        if weighed:
            result.brake = BrakeReading(
                weighed, result.rows_pulled, brake.limit(result.rows_pulled)
            )
        if dry_run or not counted:
            return result
        if result.brake is not None and result.brake.exceeded and not brake.allow_mass_change:
            raise MassChangeError(
                refusal(pull.sink.table, result.brake, counted, brake, epoch),
                table=pull.sink.table,
                counted=result.brake.counted,
                limit=result.brake.limit,
                sink_rows=result.brake.table_rows,
                **{k: counted.get(k, 0) for k in ("missing", "extra", "changed")},
            )
        job = ApplyJob(pull.sink, schema, epoch, newest, options.batch_rows)
        work = diff.join(expected.select(*schema.names), keys, "left").repartition(
            len(pull.ranges), *keys
        )
        # The executors commit as they go: interrupted from here, what they
        # wrote is in doubt (whole transactions; a verify shows what is left).
        point = interrupts.commit_point(f"the repair of {pull.sink.table} by the executors")
        with interrupts.step("the executors' repair"):
            done = work.mapInArrow(
                lambda it: apply_task(job, it), "applied long, stale long, transactions long"
            ).collect()
        point.committed()
        result.applied = sum(int(r["applied"]) for r in done)
        result.stale = sum(int(r["stale"]) for r in done)
        result.transactions = sum(int(r["transactions"]) for r in done)
        return result
    finally:
        classified.unpersist()


def _split(table: str, schema: str | None) -> tuple[str | None, str]:
    if schema is None and "." in table:
        head, _, tail = table.partition(".")
        return head, tail
    return schema, table


def spark_recover(
    spark: Any,
    dsn: str,
    store: str,
    pipeline: str,
    table: str,
    **options: Unpack[SparkRecoverKeywords],
) -> SparkReport:
    """Verify (or repair) a PostgreSQL sink table against its expected state, on Spark.

    Args:
        spark: the SparkSession (any master: local, ``local-cluster``, a cluster).
        dsn: the sink database (libpq DSN or URL); executors connect with it.
        store: the expected-state store root (every executor reads it).
        pipeline: the pipeline's name.
        table: the sink table (``name`` or ``schema.name``).
        **options: the keywords of :class:`~reconcile.spark.options.SparkRecoverOptions`:
            ``sink``, ``keys``, ``schema``, ``dry_run`` (True: the default, a
            verify), ``partitions``, ``batch_rows``, ``samples``, ``brake``.

    Returns:
        The counts, with ``mode`` "full" and what the job did.

    Raises:
        InvalidInputError: no such store table, schemas that do not match (the
            column is named), a first key column that cannot be cut into ranges,
            or a repair of a sink that is behind the store.
        StoreIntegrityError: the store holds what the engine did not write
            (StoreLostRowsError: it lost rows); nothing was pulled or written.
        MassChangeError: the repair would delete or change more of the table
            than the brake allows; nothing was written.
        ConfigurationError: the database cannot be reached (the password redacted).
    """

    request = SparkRecoverOptions(**options)
    if request.dry_run:
        return _recover(spark, dsn, store, pipeline, table, request)
    # A repair holds the table's turn (``recovery.engine``'s reason): a second
    # repair of the table, on Spark or not, waits for this one before it pulls.
    table_schema, table_name = _split(table, request.schema)
    name = validate_name("sink", request.sink if request.sink is not None else table_name)
    holder = SinkAt(dsn, table_name, table_schema, None, name, pipeline).target(write=False)
    try:
        with repair_turn(holder) as turn:
            report = _recover(spark, dsn, store, pipeline, table, request)
    finally:
        holder.close()
    if not turn.waited_s:
        return report
    return replace(report, repair_wait_s=turn.waited_s, repair_waited_for=turn.holder)


def _recover(
    spark: Any, dsn: str, store: str, pipeline: str, table: str, request: SparkRecoverOptions
) -> SparkReport:
    """``spark_recover``'s work (a repair's once it holds the table's turn)."""
    keys, dry_run = request.keys, request.dry_run
    started = time.monotonic()
    validate_name("pipeline", pipeline)
    table_schema, table_name = _split(table, request.schema)
    name = validate_name("sink", request.sink if request.sink is not None else table_name)
    if request.batch_rows < 1:
        raise InvalidInputError(f"batch_rows must be >= 1, got {request.batch_rows}")
    native = native_reader(spark, request.store_reader)
    parts = int(request.partitions or spark.sparkContext.defaultParallelism)
    probe = SinkAt(dsn, table_name, table_schema, tuple(keys) if keys else None, name, pipeline)
    target = probe.target(write=False)
    try:
        key_columns = list(keys) if keys else target.key_columns()
        job_sink = SinkAt(dsn, table_name, table_schema, tuple(key_columns), name, pipeline)
        expected_store = ExpectedStateStore(store, pipeline, name, key_columns)
        user_schema = expected_store.user_schema
        last = expected_store.last_epoch()
        if user_schema is None or last is None:
            raise InvalidInputError(
                f"table {target.display}: the expected-state store holds no epoch of it "
                f"(pipeline {pipeline!r}, table {name!r}); check the store, pipeline and table; "
                "nothing was pulled or written"
            )
        check_columns(target.display, user_schema, target.columns(), key_columns)
        # The executors read the store's files as they are: its commits and the
        # footers of the files of the version they read are checked here first.
        expected_store.audit()
        # The store version the executors read is held from the pipeline's
        # vacuum until they are done (expected_state.holds).
        with target.snapshot(user_schema, key_columns) as snap, expected_store.holding():
            newest = snap.newest_epoch
            shared = snap.export()
            bounds = snap.range_bounds(parts)
            hooks.point(SNAPSHOT_EXPORTED)
            edges = [None, *bounds, None]
            ranges = tuple(KeyRange(lo, hi) for lo, hi in pairwise(edges))
            epoch = newest if newest is not None and newest <= last else last
            behind = newest is None or newest < last
            if behind and not dry_run:
                raise InvalidInputError(
                    f"table {target.display}: the sink's newest marker is epoch {newest}, the "
                    f"store's newest is {last}: the sink is behind (a pipeline recovering?). "
                    "Bring it to the store with the pipeline's start() or the in-process "
                    "`reconcile repair`, which also writes the missing markers; nothing was written"
                )
            expected_store.check_version(expected_store.version_of(epoch))
            try:
                pull = PullJob(job_sink, user_schema, shared, ranges)
                # Enough keys of each kind for the provenance, cut back to ``samples`` after.
                wide = replace(request, samples=max(request.samples, request.provenance_rows))
                found = _run_job(spark, pull, expected_store, epoch, newest, wide, native)
            except Exception as exc:
                rebuilt = _from_executor(exc)
                if rebuilt is exc:
                    raise
                raise rebuilt from exc
            # The rows found, traced on the driver in the snapshot the executors read
            # (a repair's commits since are not in it: who wrote the drift is told).
            traced = _provenance(snap, expected_store, found.samples, key_columns, epoch,
                                 request.provenance_rows)  # fmt: skip
        display = target.display
    finally:
        target.close()
    reason = (
        f"distributed full pull on Spark: {len(ranges)} key ranges from one snapshot; the "
        f"expected state read {found.reader}"
    )
    if behind:
        reason += f"; the sink is behind the store (marker {newest}, store {last})"
    return SparkReport(
        table=display,
        mode="full",
        reason=reason,
        target_epoch=epoch,
        rows_pulled=found.rows_pulled,
        buckets_compared=0,
        buckets_differing=0,
        missing=found.counted.get("missing", 0),
        extra=found.counted.get("extra", 0),
        changed=found.counted.get("changed", 0),
        applied=found.applied,
        seconds=round(time.monotonic() - started, 6),
        dry_run=dry_run,
        brake_counted=found.brake.counted if found.brake else 0,
        brake_limit=found.brake.limit if found.brake else None,
        sink_rows=found.brake.table_rows if found.brake else None,
        mass_change=bool(found.brake and found.brake.exceeded),
        partitions=len(ranges),
        transactions=found.transactions,
        stale=found.stale,
        samples={kind: keys[: request.samples] for kind, keys in found.samples.items()},
        provenance=traced.rows,
        provenance_note=traced.note,
        foreign_writes=traced.foreign,
    )


def _provenance(snap: Any, store: ExpectedStateStore, samples: dict[str, list[dict[str, Any]]],
                keys: list[str], epoch: int, limit: int) -> Provenance:  # fmt: skip
    """The sampled differing keys traced to their last writer (``recovery.provenance.trace``)."""
    source = ExpectedSource(store)
    key_schema = pa.schema([source.schema.field(k) for k in keys])

    def kind(name: str) -> pa.Table:
        return pa.Table.from_pylist(samples.get(name, [])[: max(limit, 0)], schema=key_schema)

    diff = Diff(missing=kind("missing"), extra=kind("extra"), changed=kind("changed"))
    return trace(snap, source, diff, key_schema.empty_table(), keys, epoch, limit)
