"""The JVM real-time writer's transactions on a real PostgreSQL, in the shared Spark session's JVM.

``jvm/realtime-writer`` is compiled from source for the session (``tests/fix_realtime.py``)
and driven through py4j without a stream: ``OffsetTxn`` replays and fences as the Python
writer does, ``MarkerWriter``'s timer commits a buffer that no further row follows, and
each task's ``open()`` refuses a marker table that changed since the driver checked it.
The checks read the target table and the marker table with SQL.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from py4j.protocol import Py4JJavaError

from reconcile.core.contract import ConfigurationError
from sinks.objects.declared import REALTIME_OFFSETS
from sinks.postgres.realtime import jdbc_connection, open_realtime_writer
from sinks.realtime import RealtimeTarget
from tests.fix_realtime import writer_classes

pytestmark = pytest.mark.integration

COLUMNS = ["k", "off"]


def target(dsn: str) -> RealtimeTarget:
    with psycopg.connect(dsn, autocommit=True) as conn:
        # No key on purpose: a record written twice shows as two rows.
        conn.execute("CREATE TABLE IF NOT EXISTS events (k text NOT NULL, off bigint NOT NULL)")
    found = RealtimeTarget(dsn, "events", tuple(COLUMNS), pipeline="shop", sink="events")
    open_realtime_writer(found).close()  # the driver's part: the marker table, created
    return found


def rows(dsn: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT k, off FROM events ORDER BY off, k").fetchall()


def marker(dsn: str, partition: int) -> tuple[int, int]:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT last_offset, generation FROM reconcile.reconcile_realtime_offsets "
            "WHERE pipeline = 'shop' AND sink = 'events' AND topic = 'in' "
            "AND kafka_partition = %s",
            (partition,),
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def expected(offsets: range) -> list[tuple[str, int]]:
    return [(f"in-0-{o}", o) for o in offsets]


def marker_check(t: RealtimeTarget) -> tuple[str, str]:
    """The driver's part for the JVM writer: the markers checked, and their facts."""
    driver = open_realtime_writer(t)
    try:
        return driver.marker_check()
    finally:
        driver.close()


def marker_writer(jvm: Any, t: RealtimeTarget, check: tuple[str, str]) -> Any:
    """A ``MarkerWriter`` of rows laid out as topic, partition, offset, k, off."""
    url, properties = jdbc_connection(t.dsn, "test")
    return jvm.io.reconcile.realtime.MarkerWriter(
        url, properties, "public", "events", COLUMNS, t.pipeline, t.sink, "reconcile",
        REALTIME_OFFSETS.name, [0, 1, 2, 3, 4], 1000, 100, *check,
    )  # fmt: skip


def txn(jvm: Any, dsn: str) -> Any:
    """An ``OffsetTxn`` on a connection of its own (as one task has)."""
    url, properties = jdbc_connection(dsn, "test")
    props = jvm.java.util.Properties()
    for key, value in properties.items():
        props.setProperty(key, value)
    conn = jvm.org.postgresql.Driver().connect(url, props)
    return jvm.io.reconcile.realtime.OffsetTxn(
        conn, "public", "events", COLUMNS, "shop", "events", "reconcile", REALTIME_OFFSETS.name
    )


def records(jvm: Any, offsets: range) -> list[Any]:
    record = jvm.io.reconcile.realtime.OffsetRecord
    return [record("in", 0, o, [f"in-0-{o}", o]) for o in offsets]


def test_a_replay_writes_only_the_offsets_past_the_marker(
    spark: Any, realtime_writer_jar: Path, pg_db: str
) -> None:
    target(pg_db)
    with writer_classes(spark, realtime_writer_jar) as jvm:
        first = txn(jvm, pg_db)
        assert first.commit(records(jvm, range(0, 3))) == 3
        first.close()
        assert rows(pg_db) == expected(range(3))
        assert marker(pg_db, 0) == (2, 1)
        # The batch re-runs from its start offsets (a restarted driver, a retried task).
        replay = txn(jvm, pg_db)
        assert replay.commit(records(jvm, range(0, 5))) == 2
        replay.close()
    assert rows(pg_db) == expected(range(5))  # none twice, none missing
    assert marker(pg_db, 0) == (4, 2)  # the replaying writer claimed a newer generation


def test_a_fenced_writers_transaction_rolls_back_with_its_rows(
    spark: Any, realtime_writer_jar: Path, pg_db: str
) -> None:
    target(pg_db)
    with writer_classes(spark, realtime_writer_jar) as jvm:
        zombie, successor = txn(jvm, pg_db), txn(jvm, pg_db)
        assert zombie.commit(records(jvm, range(0, 3))) == 3
        assert successor.commit(records(jvm, range(0, 5))) == 2
        with pytest.raises(Py4JJavaError) as fenced:
            zombie.commit(records(jvm, range(5, 8)))
        assert "FencedException" in str(fenced.value.java_exception.getClass().getName())
        assert "in[0] was claimed by generation 2" in str(fenced.value.java_exception.getMessage())
        assert rows(pg_db) == expected(range(5))  # nothing of the zombie's transaction
        assert marker(pg_db, 0) == (4, 2)
        assert successor.commit(records(jvm, range(5, 8))) == 3
        zombie.close()
        successor.close()
    assert rows(pg_db) == expected(range(8))


def test_the_timer_commits_a_buffer_no_further_row_follows(
    spark: Any, realtime_writer_jar: Path, pg_db: str
) -> None:
    t = target(pg_db)
    with writer_classes(spark, realtime_writer_jar) as jvm:
        writer = marker_writer(jvm, t, marker_check(t))
        assert writer.open(0, 0)
        try:
            for o in range(3):
                values = spark.sparkContext._gateway.new_array(jvm.java.lang.Object, 5)
                for i, v in enumerate(("in", 0, o, f"in-0-{o}", o)):
                    values[i] = v
                writer.process(jvm.org.apache.spark.sql.RowFactory.create(values))
            # No row follows and the task does not end: only the timer can commit them.
            deadline = time.monotonic() + 20
            while len(rows(pg_db)) < 3 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert rows(pg_db) == expected(range(3))
            assert marker(pg_db, 0) == (2, 1)
        finally:
            writer.close(None)
    assert rows(pg_db) == expected(range(3))


def test_the_jdbc_url_holds_no_password_and_what_jdbc_cannot_take_is_refused_by_name() -> None:
    url, properties = jdbc_connection(
        "host=db.example port=6543 dbname=my/db user=writer password=s3cret sslmode=require",
        "real-time sink events",
    )
    assert url == "jdbc:postgresql://db.example:6543/my%2Fdb"
    assert properties["password"] == "s3cret" and properties["user"] == "writer"
    assert properties["sslmode"] == "require"
    assert "TimeZone=UTC" in properties["options"]  # the engine's session settings
    # A server that vanished without closing the socket fails the read, not the task's slot.
    assert (properties["tcpKeepAlive"], properties["socketTimeout"]) == ("true", "120")
    with pytest.raises(ConfigurationError, match="over TCP to one host, not to '/run/pg'"):
        jdbc_connection("host=/run/pg dbname=x password=s3cret", "real-time sink events")
    with pytest.raises(ConfigurationError, match=r"parameter\(s\) target_session_attrs") as refused:
        jdbc_connection(
            "host=h dbname=x password=s3cret target_session_attrs=read-write",
            "real-time sink events",
        )
    assert "s3cret" not in str(refused.value)


def test_an_unknown_writer_is_refused_by_name(pg_db: str) -> None:
    from reconcile.spark.realtime import start_realtime

    with pytest.raises(ConfigurationError, match="writer must be one of jvm, python, got 'scala'"):
        start_realtime(object(), target(pg_db), checkpoint="unused", writer="scala")


@pytest.mark.parametrize(
    ("change", "python_finding"),
    [
        ("GRANT INSERT ON reconcile.reconcile_realtime_offsets TO PUBLIC", "writable by other"),
        ("ALTER TABLE reconcile.reconcile_realtime_offsets ADD COLUMN note text", "has columns"),
    ],
)
def test_each_task_refuses_marker_table_another_role_can_reach_or_of_another_shape(
    spark: Any, realtime_writer_jar: Path, pg_db: str, change: str, python_finding: str
) -> None:
    t = target(pg_db)
    check = marker_check(t)
    with writer_classes(spark, realtime_writer_jar) as jvm:
        vetted = marker_writer(jvm, t, check)
        assert vetted.open(0, 0)  # the table as the driver checked it: taken
        vetted.close(None)
        # Changed after the query started (its driver checked the table then).
        with psycopg.connect(pg_db, autocommit=True) as conn:
            conn.execute(change)
        task = marker_writer(jvm, t, check)
        with pytest.raises(Py4JJavaError) as refused:
            task.open(0, 1)
    message = str(refused.value.java_exception.getMessage())
    assert "refusing to use the offset markers reconcile.reconcile_realtime_offsets" in message
    assert "changed since the query started" in message
    # The same table, refused by the rule itself: by a Python writer's task, and by the
    # driver of a query started now.
    with pytest.raises(ConfigurationError, match=python_finding):
        open_realtime_writer(t)
