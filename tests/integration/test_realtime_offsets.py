"""Real-Time Mode's small transactions on a real PostgreSQL, without Spark: replay skip, fence.

Each transaction writes its rows and its topic-partitions' offset markers
together; a replay of offsets already covered writes nothing twice, and a
writer whose partition a newer writer claimed is fenced with nothing written.
The checks read the target table and the marker table with SQL.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from reconcile.core.contract import ConfigurationError, FencedError
from sinks.postgres.realtime import RealtimeTxnWriter
from sinks.realtime import OffsetRecord, RealtimeTarget

pytestmark = pytest.mark.integration


def target(dsn: str) -> RealtimeTarget:
    with psycopg.connect(dsn, autocommit=True) as conn:
        # No key on purpose: a record written twice shows as two rows.
        conn.execute("CREATE TABLE IF NOT EXISTS events (k text NOT NULL, off bigint NOT NULL)")
    return RealtimeTarget(dsn, "events", ("k", "off"), pipeline="shop", sink="events")


def records(topic: str, partition: int, offsets: range) -> list[OffsetRecord]:
    return [OffsetRecord(topic, partition, o, (f"{topic}-{partition}-{o}", o)) for o in offsets]


def rows(dsn: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT k, off FROM events ORDER BY k, off").fetchall()


def marker(dsn: str, topic: str, partition: int) -> tuple[int, int]:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT last_offset, generation FROM reconcile.reconcile_realtime_offsets "
            "WHERE pipeline = 'shop' AND sink = 'events' AND topic = %s AND kafka_partition = %s",
            (topic, partition),
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def expected(topic: str, partition: int, offsets: range) -> list[tuple[str, int]]:
    return [(f"{topic}-{partition}-{o}", o) for o in offsets]


def test_a_replayed_batch_writes_only_the_records_past_each_partitions_marker(pg_db: str) -> None:
    t = target(pg_db)
    with psycopg.connect(pg_db, autocommit=True) as conn:
        first = RealtimeTxnWriter(t, conn)
        assert first.commit(records("in", 0, range(0, 10)) + records("in", 1, range(0, 4))) == 14
        assert first.commit(records("in", 0, range(10, 12))) == 2
    assert marker(pg_db, "in", 0) == (11, 1)
    assert marker(pg_db, "in", 1) == (3, 1)
    # The batch re-runs from its start offsets (a restarted driver, a retried task).
    with psycopg.connect(pg_db, autocommit=True) as conn:
        replay = RealtimeTxnWriter(t, conn)
        assert replay.commit(records("in", 0, range(0, 15)) + records("in", 1, range(0, 6))) == 5
    found = rows(pg_db)
    want = sorted(expected("in", 0, range(15)) + expected("in", 1, range(6)))
    assert sorted(found) == want  # none twice, none missing
    assert marker(pg_db, "in", 0) == (14, 2)  # the replaying writer claimed a newer generation


def test_a_writer_fenced_by_a_newer_generation_rolls_back_its_transaction(pg_db: str) -> None:
    t = target(pg_db)
    with (
        psycopg.connect(pg_db, autocommit=True) as old_conn,
        psycopg.connect(pg_db, autocommit=True) as new_conn,
    ):
        zombie = RealtimeTxnWriter(t, old_conn)
        assert zombie.commit(records("in", 0, range(0, 3))) == 3
        successor = RealtimeTxnWriter(t, new_conn)
        assert successor.commit(records("in", 0, range(0, 5))) == 2
        with pytest.raises(FencedError, match=r"in\[0\] was claimed by generation 2"):
            zombie.commit(records("in", 0, range(5, 8)))
        # Nothing of the zombie's transaction: no row, and the marker as the successor left it.
        assert sorted(rows(pg_db)) == sorted(expected("in", 0, range(5)))
        assert marker(pg_db, "in", 0) == (4, 2)
        assert successor.commit(records("in", 0, range(5, 8))) == 3
    assert sorted(rows(pg_db)) == sorted(expected("in", 0, range(8)))
    assert marker(pg_db, "in", 0) == (7, 2)


def test_a_bad_sink_name_is_refused_by_name() -> None:
    with pytest.raises(ConfigurationError, match="sink name 'no-dash'"):
        RealtimeTarget("dbname=x", "events", ("k",), pipeline="shop", sink="no-dash")


def test_the_foreach_writer_commits_by_row_count_and_drops_a_failed_tasks_buffer(
    pg_db: str,
) -> None:
    from reconcile.spark.realtime import RealtimeForeachWriter

    t = target(pg_db)

    def row(o: int) -> dict[str, Any]:  # what Spark's Row gives by name
        return {"topic": "in", "partition": 0, "offset": o, "k": f"in-0-{o}", "off": o}

    failed = RealtimeForeachWriter(t, rows_per_txn=3, ms_per_txn=60_000)
    assert failed.open(0, 0)
    for o in range(5):
        failed.process(row(o))
    assert sorted(rows(pg_db)) == expected("in", 0, range(3))  # one full transaction
    failed.close(RuntimeError("the task failed"))
    assert sorted(rows(pg_db)) == expected("in", 0, range(3))  # its buffer left to the replay
    replay = RealtimeForeachWriter(t, rows_per_txn=3, ms_per_txn=60_000)
    assert replay.open(0, 1)
    for o in range(6):
        replay.process(row(o))
    replay.close(None)
    assert sorted(rows(pg_db)) == expected("in", 0, range(6))


@pytest.mark.parametrize(("rows_per_txn", "ms_per_txn"), [(0, 100), (100, -1)])
def test_bounds_no_writer_can_keep_are_refused_before_anything_is_created(
    pg_db: str, rows_per_txn: int, ms_per_txn: int
) -> None:
    from reconcile.spark.realtime import start_realtime
    from sinks.objects.postgres import REALTIME_OFFSETS

    target = RealtimeTarget(pg_db, "events", ("k",), pipeline="shop", sink="s")
    # No frame: the refusal comes before the plan, the marker table and the checkpoint.
    with pytest.raises(ConfigurationError, match="rows_per_txn must be >= 1"):
        start_realtime(object(), target, checkpoint="/nonexistent", rows_per_txn=rows_per_txn,
                       ms_per_txn=ms_per_txn)  # fmt: skip
    with psycopg.connect(pg_db) as conn:
        found = conn.execute(
            "SELECT to_regclass(format('%%I.%%I', %s::text, %s::text))",
            (target.state_schema, REALTIME_OFFSETS.name),
        ).fetchone()
    assert found == (None,)
