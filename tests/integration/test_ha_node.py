"""The HA node's failure handling, in process: a real Spark stream into a real Postgres.

- a leader whose lease renewal gets no answer steps down: renewals that time
  out (the lease table locked) make the heartbeat say so; a renewal that hangs
  outright (the lease's server process stopped) is caught by the node's own
  clock;
- an epoch the database rejects stops the node at once: ``run()`` raises the
  RejectedError, one writer generation was claimed, the lease is released;
- an epoch that keeps failing for another reason is run again with backoff as
  the same writer generation, and after ``QUERY_FAILURES`` failures in a row
  the node stops with a FatalError naming it.

The generation is read from the store's Delta log, the marker and rows from
Postgres, the lease from its row.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from deltalake import DeltaTable
from psycopg import sql

from expected_state.progress_log import StoreProgressLog, progress_fence_id
from reconcile.core.contract import FatalError, RejectedError
from reconcile.core.metrics import InMemoryMetrics
from reconcile.engine.cycle import CommitCycle
from reconcile.engine.expected import ExpectedState
from reconcile.ha import HaNode
from reconcile.ha.leading import QUERY_FAILURES, Heartbeat
from sinks.postgres.factory import postgres_sink
from sinks.postgres.lease import PgLease
from tests.fix_pg import markers_table

pytestmark = [pytest.mark.integration]

PIPE = "hanode"
ROWS = 5  # per file
TABLE = (
    "CREATE TABLE lines (id bigint PRIMARY KEY, qty bigint, _epoch bigint, "
    "CONSTRAINT qty_not_negative CHECK (qty >= 0))"
)


def lease_table(conn: psycopg.Connection[Any]) -> sql.Identifier:
    """The lease table, wherever the lease put it."""
    row = conn.execute(
        "SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE c.relname = 'reconcile_leases'"
    ).fetchone()
    assert row is not None, "no lease table"
    return sql.Identifier(row[0], "reconcile_leases")


def lease_backend(dsn: str, pipeline: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s",
            (f"reconcile-lease:{pipeline}",),
        ).fetchall()
    assert len(rows) == 1, rows
    return int(rows[0][0])


def wait_until(what: str, check: Callable[[], bool], within_s: float) -> None:
    deadline = time.monotonic() + within_s
    while not check():
        assert time.monotonic() < deadline, f"not within {within_s}s: {what}"
        time.sleep(0.05)


def test_a_heartbeat_whose_renewals_time_out_says_the_lease_is_lost(pg_db: str) -> None:
    lease = PgLease(pg_db, PIPE, term_s=1.0, holder="a")
    assert lease.try_acquire() is not None
    blocker = psycopg.connect(pg_db)
    heartbeat = Heartbeat(lease, 0.25)
    try:
        # Every renewal now waits on the table, and its lock wait (half a term) runs out:
        # no answer, ever, not even the "no" a row past its term would give.
        blocker.execute(
            sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(lease_table(blocker))
        )
        heartbeat.start()
        wait_until("the heartbeat says the lease is lost", heartbeat.lost.is_set, 10)
        assert not lease.held()
        heartbeat.join(5)
        assert not heartbeat.is_alive()
    finally:
        heartbeat.done.set()
        blocker.close()
        lease.close()


@pytest.fixture
def inbox(tmp_path: Path) -> Callable[[int, int], None]:
    """Drop file ``number`` (ids number*ROWS...; the last row's qty ``last_qty``) in the inbox."""
    folder = tmp_path / "inbox"
    folder.mkdir()

    def drop(number: int, last_qty: int = 1) -> None:
        ids = range(number * ROWS, (number + 1) * ROWS)
        aside = tmp_path / f"part-{number:03d}.json"
        aside.write_text("".join(
            json.dumps({"id": i, "qty": last_qty if i == ids[-1] else i}) + "\n" for i in ids
        ))  # fmt: skip
        at = time.time() - 100 + number  # Spark takes the older file first
        os.utime(aside, (at, at))
        aside.rename(folder / aside.name)

    return drop


@contextlib.contextmanager
def running(node: HaNode) -> Iterator[dict[str, Any]]:
    """``node.run()`` in a thread; what it raised is in the dict's "error"."""
    stop = threading.Event()
    ended: dict[str, Any] = {"stop": stop}

    def run() -> None:
        try:
            node.run(stop=stop)
        except BaseException as exc:
            ended["error"] = exc

    thread = threading.Thread(target=run, name="ha-node", daemon=True)
    thread.start()
    ended["thread"] = thread
    try:
        yield ended
    finally:
        stop.set()
        thread.join(60)
        assert not thread.is_alive(), "the node did not stop"


def make_node(spark: Any, dsn: str, root: Path, *, transform: Any = None, **kw: Any) -> HaNode:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(TABLE)

    def build() -> CommitCycle:
        expected = ExpectedState(str(root / "store"), PIPE, {"lines": ["id"]})
        return CommitCycle(PIPE, [postgres_sink(dsn, "lines", name="lines")],
                           expected_state=expected, metrics=kw.get("metrics"))  # fmt: skip

    frame = (
        spark.readStream.schema("id long, qty long")
        .option("maxFilesPerTrigger", 1)
        .json(str(root / "inbox"))
    )
    return HaNode(
        frame, build, lease=PgLease(dsn, PIPE, term_s=1.0), checkpoint=str(root / "checkpoint"),
        staging=str(root / "staging"), outputs={"lines": transform} if transform else None,
        trigger={"processingTime": "200 milliseconds"}, warm=False, **kw,
    )  # fmt: skip


def store_generation(root: Path) -> int | None:
    uri = StoreProgressLog(str(root / "store"), PIPE).uri
    return DeltaTable(uri).transaction_version(progress_fence_id(PIPE))


def marked_epochs(dsn: str) -> list[int]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        table = markers_table(conn)
        if table is None:  # no sink has set itself up yet
            return []
        rows = conn.execute(
            sql.SQL("SELECT epoch FROM {} WHERE pipeline = %s ORDER BY 1").format(table), (PIPE,)
        ).fetchall()
    return [int(r[0]) for r in rows]


def live_lease(dsn: str) -> bool:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            sql.SQL("SELECT expires_at > clock_timestamp() FROM {} WHERE pipeline = %s").format(
                lease_table(conn)
            ),
            (PIPE,),
        ).fetchone()
    return bool(row and row[0])


def test_a_leader_whose_renewal_hangs_steps_down(
    spark: Any, pg_db: str, tmp_path: Path, inbox: Callable[[int, int], None]
) -> None:
    inbox(0, 1)
    node = make_node(spark, pg_db, tmp_path)
    with running(node):
        wait_until("the first commit", lambda: marked_epochs(pg_db) == [0], 60)
        assert node.leading
        backend = lease_backend(pg_db, PIPE)
        os.kill(backend, signal.SIGSTOP)  # the lease's server process answers nothing now
        try:
            wait_until("the leader steps down", lambda: node.tenures[0].ended is not None, 15)
            assert node.tenures[0].ended == "lease lost"
            assert not node.leading and node.query is None
        finally:
            os.kill(backend, signal.SIGCONT)


def test_a_rejected_epoch_stops_the_node_as_one_generation(
    spark: Any, pg_db: str, tmp_path: Path, inbox: Callable[[int, int], None]
) -> None:
    metrics = InMemoryMetrics()
    inbox(0, 1)
    inbox(1, -1)  # the last row of epoch 1 breaks qty_not_negative
    node = make_node(spark, pg_db, tmp_path, metrics=metrics)
    with running(node) as ended:
        ended["thread"].join(60)
        assert not ended["thread"].is_alive(), "the node kept going past a rejected epoch"
    error = ended.get("error")
    assert isinstance(error, RejectedError), error
    assert error.epoch == 1 and error.details["constraint"] == "qty_not_negative"
    assert [t.ended for t in node.tenures] == ["rejected"]
    assert store_generation(tmp_path) == 1  # no restart, no second takeover claimed one
    assert marked_epochs(pg_db) == [0]
    assert not live_lease(pg_db)  # released: a standby may take over at once
    assert metrics.value("pipeline.rejected", sink="lines", sqlstate="23514") == 1
    assert metrics.value("ha.step_downs", reason="rejected") == 1


def test_an_epoch_that_keeps_failing_is_retried_as_one_generation_then_stops(
    spark: Any, pg_db: str, tmp_path: Path, inbox: Callable[[int, int], None]
) -> None:
    inbox(0, 1)
    inbox(1, 1)

    def transform(batch: Any, batch_id: int) -> Any:
        if batch_id == 1:
            raise RuntimeError("the transform cannot read epoch 1")  # not the database's
        return batch

    node = make_node(spark, pg_db, tmp_path, transform=transform)
    with running(node) as ended:
        ended["thread"].join(90)
        assert not ended["thread"].is_alive(), "the node kept going past a failing epoch"
    error = ended.get("error")
    assert isinstance(error, FatalError) and not isinstance(error, RejectedError), error
    assert f"epoch 1 failed {QUERY_FAILURES} times in a row" in str(error)
    assert "the transform cannot read epoch 1" in str(error)
    assert [t.ended for t in node.tenures] == ["query failing"]
    # Every run again of epoch 1 went on with the takeover's cycle: one generation.
    assert store_generation(tmp_path) == 1
    assert marked_epochs(pg_db) == [0]
    assert not live_lease(pg_db)
