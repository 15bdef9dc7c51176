"""The demo's pipeline process: lineitem files -> Spark Structured Streaming -> two Postgres sinks.

``python -m reconcile.demo.tpch.pipeline WORKDIR [TRIGGER_SECONDS [MASTER [VIA]]]``, with
the sink database's DSN in ``RECONCILE_DEMO_DSN`` (never on the command line,
where ``ps`` shows it). The supervisor starts it, kills it, and starts it again.

Each micro-batch (one dropped file) is one epoch of pipeline ``demo``, written
by ``reconcile.spark.write_stream`` into:

- ``demo_lineitem``: the batch's lines;
- ``demo_customer_revenue``: per customer (a join with ``orders``), the running
  total of ``l_extendedprice * (1 - l_discount)`` and the count of lines
  (``reconcile.demo.tpch.revenue``: the totals as of the epoch before, plus
  the batch's own sum; a batch run again computes the same total).

A restarted process brings both tables to the expected state of the newest
decided epoch (``reconcile.recover``, pull-and-diff, scoped to what may have
changed) while Spark starts on a thread of its own (``SparkStart``), then
resumes the stream from Spark's checkpoint. It stops once every line of
lineitem is in a decided epoch.

The event log gets the steps of every start: ``process`` (the interpreter
is up), ``spark_starting`` (Spark's thread begins, before the recovery),
``recovery`` per table and ``settled`` (the sinks hold the newest decided
epoch; ``spark`` says whether Spark was still starting), ``spark_up`` (from
Spark's thread, whenever it is up), ``started`` (the query) and
``first_commit`` (the first epoch this process committed, from
``EventMetrics``). The latency benchmark's restart timeline is drawn from
them.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq  # type: ignore[import-untyped, unused-ignore]

from reconcile.core.contract import RetryableError
from reconcile.demo.tpch.events import EventLog, EventMetrics
from reconcile.demo.tpch.revenue import revenue_transform

__all__ = [
    "KEYS", "PIPELINE", "Args", "DoneCheck", "Setup", "SparkStart", "await_progress",
    "decided_epochs", "main", "parse_args", "setup", "start_spark",
]  # fmt: skip

PIPELINE = "demo"
KEYS = {"demo_lineitem": ["l_orderkey", "l_linenumber"], "demo_customer_revenue": ["o_custkey"]}
CHECK_EVERY_S = 3.0  # how often a running pipeline checks whether every line is in


def recover_tables(dsn: str, store: str, last: int, events: EventLog) -> None:
    """Bring every sink table to the expected state of epoch ``last`` (pull-and-diff).

    A crash may have left an epoch decided but not in a sink; the store holds
    its rows, and recovery applies only what differs. Retried while the
    database is unreachable (the chaos proxy drops connections).
    """
    from reconcile.recovery.api import recover

    for table in KEYS:
        for attempt in range(20):
            try:
                found = recover(dsn, store, PIPELINE, table, mode="auto", after_crash=True,
                                target_epoch=last)  # fmt: skip
                break
            except RetryableError:
                if attempt == 19:
                    raise
                time.sleep(0.5)
        events.write("recovery", table=table, epoch=last, mode=str(found.mode),
                     missing=found.missing, extra=found.extra, changed=found.changed,
                     applied=found.applied)  # fmt: skip


@dataclass
class Setup:
    """What a pipeline process needs: its store, the stream, the sinks, and the done check."""

    workdir: Path
    dsn: str
    events: EventLog
    store: str
    spark: Any
    lines: Any  # the streaming DataFrame of dropped lineitem files
    build: Callable[[], Any]  # -> CommitCycle
    outputs: dict[str, Any]
    all_in: Callable[[int | None], bool]


def start_spark(workdir: Path, master: str, events: EventLog) -> tuple[Any, Any]:
    """Spark's session as the pipeline runs it, and ``orders`` cached: (spark, orders)."""
    from reconcile.spark.session import local_session

    spark = local_session(
        "reconcile-demo",
        master,
        **{
            "spark.sql.shuffle.partitions": "2",
            "spark.sql.adaptive.enabled": "false",
            # Every batch's progress, for the report a run writes (batch_progress).
            "spark.sql.streaming.numRecentProgressUpdates": "100000",
        },
    )
    spark.sparkContext.setLogLevel("ERROR")
    events.write("spark_up")
    orders = (
        spark.read.parquet(str(workdir / "tpch" / "orders.parquet"))
        .select("o_orderkey", "o_custkey")
        .cache()
    )
    orders.count()  # fill the cache now, not in the first micro-batch (a standby is warm)
    return spark, orders


class SparkStart:
    """Spark's start (``start_spark``) on a thread of its own, begun at construction.

    Why: a restarted process must bring the sinks to the newest decided
    epoch (pull-and-diff, about a second on the demo's tables) and start
    Spark (a JVM: ten seconds or more on two cores) before its stream
    resumes. Neither needs the other: the recovery reads the store and writes
    the sinks, Spark's start touches neither, and the stream starts only once
    both are done. One after the other, every restart waited for the
    recovery before it even began Spark's start.
    """

    def __init__(self, workdir: Path, master: str, events: EventLog) -> None:
        events.write("spark_starting")
        self._session: tuple[Any, Any] | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._start, args=(workdir, master, events), name="spark-start", daemon=True
        )
        self._thread.start()

    def _start(self, workdir: Path, master: str, events: EventLog) -> None:
        try:
            self._session = start_spark(workdir, master, events)
        except BaseException as exc:  # handed to the main thread by session()
            self._error = exc

    def state(self) -> str:
        """``starting`` or ``up`` (what the ``settled`` event reports)."""
        return "starting" if self._thread.is_alive() else "up"

    def session(self) -> tuple[Any, Any]:
        """(spark, orders) once Spark is up.

        Raises:
            Whatever Spark's start raised.
        """
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._session is not None
        return self._session


def setup(workdir: Path, dsn: str, master: str, session: tuple[Any, Any] | None = None) -> Setup:
    """Describe the stream (Spark started here unless ``session`` is given); no sink touched."""
    from expected_state.store import ExpectedStateStore
    from reconcile import CommitCycle
    from reconcile.demo.tpch.kafka_source import lines_stream
    from reconcile.engine.expected import ExpectedState
    from sinks.postgres.factory import postgres_sink

    events = EventLog(workdir / "events.jsonl")
    store = str(workdir / "expected_state")
    # Done is every line of lineitem in the expected state as of a decided
    # epoch, not a batch id: after a restart Spark may take two files into one
    # micro-batch, so batch ids need not match file numbers.
    total: int = pq.ParquetFile(workdir / "tpch" / "lineitem.parquet").metadata.num_rows
    lines_store = ExpectedStateStore(store, PIPELINE, "demo_lineitem", KEYS["demo_lineitem"])

    def all_in(epoch: int | None) -> bool:
        # First the rows the store's log records (no file opened): fewer than the
        # lines, and the snapshot cannot hold them all. Only then the keys are read,
        # which would otherwise take the CPU from the batches every few seconds.
        if epoch is None or lines_store.stored_rows(epoch) < total:
            return False
        keys: int = lines_store.snapshot(epoch=epoch, columns=["l_orderkey"]).num_rows
        return keys >= total

    metrics = EventMetrics(events)

    def build() -> CommitCycle:
        expected = ExpectedState(store, PIPELINE, KEYS)
        sinks = [postgres_sink(dsn, table, name=table) for table in KEYS]
        return CommitCycle(PIPELINE, sinks, expected_state=expected, metrics=metrics)

    spark, orders = session if session is not None else start_spark(workdir, master, events)
    lines = lines_stream(spark, workdir)  # the inbox's files, or the topic of --source kafka
    revenue_store = ExpectedStateStore(store, PIPELINE, "demo_customer_revenue", ["o_custkey"])
    outputs = {
        "demo_lineitem": lambda batch: batch,
        "demo_customer_revenue": revenue_transform(orders, revenue_store),
    }
    return Setup(workdir, dsn, events, store, spark, lines, build, outputs, all_in)


class DoneCheck:
    """Whether every line is in, asked at most every ``CHECK_EVERY_S`` and once per new epoch.

    The check reads every key of the lineitem store: at most every few seconds,
    so that it does not compete with the batches for the CPU.
    """

    def __init__(self, all_in: Callable[[int | None], bool]) -> None:
        self.all_in = all_in
        self.checked: int | None = None
        self._next = 0.0

    def __call__(self, newest: int | None) -> bool:
        if newest is None or newest == self.checked or time.monotonic() < self._next:
            return False
        self.checked, self._next = newest, time.monotonic() + CHECK_EVERY_S
        return self.all_in(newest)


def batch_progress(query: Any, writer: Any = None) -> list[dict[str, Any]]:
    """Each micro-batch that read rows: Spark's durations and the writer's own split of them.

    ``trigger_ms`` is the whole batch (Spark's ``triggerExecution``), ``stage_ms``
    and ``commit_ms`` the writer's staging and commit cycle within its ``addBatch``,
    ``via`` the way each sink's rows were staged (None, {} without a
    ``reconcile.spark`` writer).
    """
    ours = {stats.batch_id: stats for stats in writer.history} if writer is not None else {}
    out = []
    for p in query.recentProgress:
        if p["numInputRows"] <= 0:
            continue
        stats = ours.get(p["batchId"])
        out.append({
            "batch": p["batchId"],
            "rows": p["numInputRows"],
            "trigger_ms": p["durationMs"].get("triggerExecution"),
            "add_batch_ms": p["durationMs"].get("addBatch"),
            "stage_ms": stats.stage_ms if stats is not None else None,
            "commit_ms": stats.commit_ms if stats is not None else None,
            "via": dict(stats.via) if stats is not None else {},
            "at": p["timestamp"],
        })  # fmt: skip
    return out


def await_progress(query: Any, batch_id: int, timeout: float = 10.0) -> None:
    """Wait until Spark reports micro-batch ``batch_id``'s progress (at most ``timeout`` s).

    A batch's progress is reported after its sink has written it: a process
    that stops the query as soon as the rows are in would leave the last batch
    out of the durations it writes.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(p["batchId"] >= batch_id for p in query.recentProgress):
            return
        time.sleep(0.05)


def decided_epochs(writer: Any) -> list[int]:
    """The epochs a StreamWriter committed, skipped or found in every sink already."""
    report = writer.report
    decided = [*report.committed_epochs, *report.skipped_epochs]
    batch = writer.last
    if batch is not None and batch.replayed:
        decided.append(batch.batch_id)  # re-run, in every sink already
    return decided


@dataclass
class Args:
    """The process's command line: ``WORKDIR [TRIGGER_SECONDS [MASTER [VIA]]]``, and the DSN."""

    workdir: Path
    dsn: str
    master: str
    via: str
    trigger: dict[str, Any] | None
    rest: list[str]  # what follows VIA (the HA pipeline's ROLE)


def parse_args(argv: list[str]) -> Args:
    """The command line, with the sink database's DSN from ``RECONCILE_DEMO_DSN``."""
    trigger_s = float(argv[1]) if len(argv) > 1 else 0.0
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    return Args(
        workdir=Path(argv[0]),
        dsn=os.environ["RECONCILE_DEMO_DSN"],
        master=argv[2] if len(argv) > 2 else "local[2,4]",
        via=argv[3] if len(argv) > 3 else "auto",
        trigger={"processingTime": f"{trigger_s} seconds"} if trigger_s else None,
        rest=argv[4:],
    )


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.rest:
        raise SystemExit(f"unexpected arguments {args.rest}: a ROLE is for "
                         "reconcile.demo.tpch.ha_pipeline")  # fmt: skip
    workdir, dsn, master, via, trigger = args.workdir, args.dsn, args.master, args.via, args.trigger
    from expected_state.progress_log import StoreProgressLog
    from reconcile.spark.stream import write_stream

    events = EventLog(workdir / "events.jsonl")
    events.write("process")
    store = str(workdir / "expected_state")
    # Spark starts first, on its own thread: the pull-and-diff below runs beside it.
    spark = SparkStart(workdir, master, events)
    last = StoreProgressLog(store, PIPELINE).last_committed()
    if last is not None:
        recover_tables(dsn, store, last, events)
    events.write("settled", last=last, spark=spark.state())
    parts = setup(workdir, dsn, master, session=spark.session())
    if parts.all_in(last):
        events.write("finished", last=last)
        return 0
    query = write_stream(
        parts.lines,
        parts.build,
        checkpoint=workdir / "checkpoint",
        staging=workdir / "staging",
        outputs=parts.outputs,
        trigger=trigger,
        query_name="reconcile_demo",
        via=via,
    )
    writer = query.reconcile_writer
    events.write("started", last=last)
    seen = 0
    done = DoneCheck(parts.all_in)
    try:
        while query.isActive:
            query.awaitTermination(0.2)
            report = writer.report
            for epoch in report.committed_epochs[seen:]:
                events.write("committed", epoch=epoch)
            seen = len(report.committed_epochs)
            if done(max(decided_epochs(writer), default=None)):
                break
        if query.exception() is not None:
            raise RuntimeError(f"the streaming query failed: {query.exception()}")
    finally:
        if writer.last is not None:
            await_progress(query, writer.last.batch_id)
        progress = batch_progress(query, writer)
        query.stop()
        writer.close()
        out = workdir / "progress" / f"{os.getpid()}.json"
        out.parent.mkdir(exist_ok=True)
        out.write_text(json.dumps(progress))
    events.write("finished", last=done.checked)
    parts.spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
