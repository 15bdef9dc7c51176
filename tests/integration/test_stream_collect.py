"""The streaming writer's collect path: which micro-batches it takes, and its ways out.

``via="auto"`` collects a micro-batch to the driver (Spark's Arrow collect)
when Spark's estimate of its input is at most ``collect_max_bytes``, and
stages it on the executors otherwise, when the collect runs over
``spark.driver.maxResultSize``, or when that limit is off. These tests run the
shared Spark session against a real PostgreSQL and read the rows back from it.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pytest

pytestmark = [pytest.mark.integration]

ROWS = 40  # per file
FILES = 2
FANOUT = 4000  # rows each input row becomes in the test that outgrows a collect
EVENTS = "CREATE TABLE events (id bigint PRIMARY KEY, amount bigint, _epoch bigint)"


def _inbox(root: Path, *, pad: tuple[int, ...] = (0,) * FILES) -> list[int]:
    """File f holds ids f*ROWS .. f*ROWS+ROWS-1, each row ``pad[f]`` bytes longer; their sizes.

    The padding is a field the stream's schema does not read.
    """
    inbox = root / "inbox"
    inbox.mkdir()
    start = time.time() - 100
    for f in range(FILES):
        path = inbox / f"part-{f}.json"
        with path.open("w") as out:
            for i in range(f * ROWS, (f + 1) * ROWS):
                row = {"id": i, "amount": i * 2, **({"pad": "x" * pad[f]} if pad[f] else {})}
                out.write(json.dumps(row) + "\n")
        os.utime(path, (start + f, start + f))  # Spark takes the older file first
    return [(inbox / f"part-{f}.json").stat().st_size for f in range(FILES)]


def _run(
    spark: Any,
    dsn: str,
    root: Path,
    *,
    transform: Any = None,
    table: str = EVENTS,
    **kwargs: Any,
) -> list[Any]:
    """Stream ``root/inbox`` into table ``events`` (expected state keyed by id); the history."""
    from reconcile import CommitCycle
    from reconcile.engine.expected import ExpectedState
    from reconcile.spark.stream import write_stream
    from sinks.postgres.factory import postgres_sink

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(table.encode())

    def build() -> CommitCycle:
        expected = ExpectedState(str(root / "store"), "shop", {"events": ["id"]})
        return CommitCycle("shop", [postgres_sink(dsn, "events", name="events")],
                           expected_state=expected)  # fmt: skip

    frame = (
        spark.readStream.schema("id long, amount long")
        .option("maxFilesPerTrigger", 1)
        .json(str(root / "inbox"))
    )
    query = write_stream(
        frame, build, checkpoint=root / "checkpoint", staging=root / "staging",
        outputs={"events": transform} if transform is not None else None,
        trigger={"availableNow": True}, **kwargs,
    )  # fmt: skip
    query.awaitTermination()
    writer = query.reconcile_writer
    writer.close()
    assert query.exception() is None
    return list(writer.history)


def _events(dsn: str) -> list[tuple[int, int, int]]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT id, amount, _epoch FROM events ORDER BY id").fetchall()
    return [(int(a), int(b), int(c)) for a, b, c in rows]


def test_a_small_micro_batch_is_collected_and_written_once(
    spark: Any, pg_db: str, tmp_path: Path
) -> None:
    sizes = _inbox(tmp_path)
    history = _run(spark, pg_db, tmp_path)
    assert [b.via for b in history] == [{"events": "collect"}] * FILES
    # Spark's estimate of a file batch is the file's size on disk.
    assert [b.input_bytes for b in history] == sizes
    assert _events(pg_db) == [(i, i * 2, i // ROWS) for i in range(ROWS * FILES)]


def test_a_micro_batch_over_the_threshold_is_staged_on_the_executors(
    spark: Any, pg_db: str, tmp_path: Path
) -> None:
    _inbox(tmp_path)
    history = _run(spark, pg_db, tmp_path, collect_max_bytes=100)
    assert all(b.input_bytes > 100 for b in history)
    assert [b.via for b in history] == [{"events": "executors"}] * FILES
    assert _events(pg_db) == [(i, i * 2, i // ROWS) for i in range(ROWS * FILES)]


def test_an_unsafe_staging_table_sends_the_sink_through_the_driver_and_says_so_once(
    spark: Any, pg_db: str, tmp_path: Path, caplog: Any
) -> None:
    """A staging table another role owns (with a trigger) is refused: the driver path instead."""
    import uuid

    from sinks.objects.declared import stage_name

    other = f"other_{uuid.uuid4().hex[:8]}"
    name = stage_name(
        "shop", "events", ("public", "events"), [("id", "bigint"), ("amount", "bigint")]
    )
    with psycopg.connect(pg_db, autocommit=True) as conn:
        for statement in (
            f"CREATE ROLE {other}",
            "CREATE SCHEMA reconcile",
            f'CREATE UNLOGGED TABLE reconcile."{name}" (id bigint, amount bigint, '
            "_reconcile_epoch bigint, _reconcile_task text)",
            f'ALTER TABLE reconcile."{name}" OWNER TO {other}',
            "CREATE TABLE public.loot (who text)",
            "CREATE FUNCTION public.spy() RETURNS trigger LANGUAGE plpgsql AS "
            "$$BEGIN INSERT INTO public.loot VALUES (current_user); RETURN NEW; END$$",
            f'CREATE TRIGGER spy BEFORE INSERT ON reconcile."{name}" '
            "FOR EACH ROW EXECUTE FUNCTION public.spy()",
        ):
            conn.execute(statement.encode())
    _inbox(tmp_path)
    with caplog.at_level(logging.WARNING, logger="reconcile.spark.staging"):
        history = _run(spark, pg_db, tmp_path, via="executors")
    assert [b.via for b in history] == [{"events": "driver"}] * FILES
    said = [r.getMessage() for r in caplog.records if "cannot be used safely" in r.getMessage()]
    assert len(said) == 1, said  # once per query run, not once per batch
    assert f"reconcile.{name}" in said[0] and f"owned by role {other!r}" in said[0], said[0]
    assert _events(pg_db) == [(i, i * 2, i // ROWS) for i in range(ROWS * FILES)]
    with psycopg.connect(pg_db) as conn:
        assert conn.execute(f'SELECT count(*) FROM reconcile."{name}"').fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM public.loot").fetchone() == (0,)


def test_a_connection_lost_while_a_batch_is_planned_is_tried_again(
    spark: Any, pg_db: str, tmp_path: Path, caplog: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server restart or a dropped connection while staging is planned: staged again."""
    import sinks.postgres.shared_stage as shared_stage

    real, calls = shared_stage.open_stage, []

    def drops_once(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        return real(*args, **kwargs)

    monkeypatch.setattr(shared_stage, "open_stage", drops_once)
    _inbox(tmp_path)
    with caplog.at_level(logging.WARNING, logger="reconcile.spark.stream"):
        history = _run(spark, pg_db, tmp_path, via="executors")
    assert [b.via for b in history] == [{"events": "executors"}] * FILES
    again = [r.getMessage() for r in caplog.records if "again" in r.getMessage()]
    assert len(again) == 1 and "staging micro-batch 0 again" in again[0], again
    assert "server closed the connection" in again[0]
    assert _events(pg_db) == [(i, i * 2, i // ROWS) for i in range(ROWS * FILES)]


@pytest.fixture
def small_result_limit(spark: Any) -> Iterator[None]:
    """``spark.driver.maxResultSize`` at 1 MiB (Spark reads it at every job), then put back."""
    conf = spark.sparkContext._jsc.sc().conf()
    before = conf.get("spark.driver.maxResultSize", "1g")
    conf.set("spark.driver.maxResultSize", "1m")
    try:
        yield
    finally:
        conf.set("spark.driver.maxResultSize", before)


def test_a_collect_over_the_driver_result_limit_falls_back_to_the_executors(
    spark: Any, pg_db: str, tmp_path: Path, small_result_limit: None, caplog: Any
) -> None:
    """A transform that multiplies its small input past the limit: the batch still lands, once."""
    from pyspark.sql import functions as F

    def fan_out(batch: Any) -> Any:
        copies = batch.select(
            "id", "amount", F.explode(F.sequence(F.lit(0), F.lit(FANOUT - 1))).alias("copy")
        )  # 160,000 rows a batch, about 2.5 MiB in Arrow: over the 1 MiB limit
        return copies.select((F.col("id") * FANOUT + F.col("copy")).alias("id"), "amount")

    _inbox(tmp_path)
    with caplog.at_level(logging.WARNING, logger="reconcile.spark.staging"):
        history = _run(spark, pg_db, tmp_path, transform=fan_out)
    assert [b.via for b in history] == [{"events": "executors"}] * FILES
    warned = [r.getMessage() for r in caplog.records if "too large to collect" in r.getMessage()]
    assert len(warned) == FILES and "sink 'events'" in warned[0], warned
    with psycopg.connect(pg_db) as conn:
        count, distinct, low, high = conn.execute(
            "SELECT count(*), count(DISTINCT id), min(id), max(id) FROM events"
        ).fetchone()  # type: ignore[misc]
    assert count == distinct == ROWS * FILES * FANOUT
    assert (low, high) == (0, ROWS * FILES * FANOUT - 1)


def test_without_a_result_limit_nothing_is_collected(
    spark: Any, pg_db: str, tmp_path: Path, caplog: Any
) -> None:
    """``spark.driver.maxResultSize=0``: nothing would stop a collect outgrowing the driver."""
    conf = spark.sparkContext._jsc.sc().conf()
    before = conf.get("spark.driver.maxResultSize", "1g")
    conf.set("spark.driver.maxResultSize", "0")
    _inbox(tmp_path)
    try:
        with caplog.at_level(logging.WARNING, logger="reconcile.spark.stream"):
            history = _run(spark, pg_db, tmp_path)
    finally:
        conf.set("spark.driver.maxResultSize", before)
    assert [b.via for b in history] == [{"events": "executors"}] * FILES
    said = [r.getMessage() for r in caplog.records if "maxResultSize" in r.getMessage()]
    assert len(said) == 1, said  # once per writer, not once per batch
    assert _events(pg_db) == [(i, i * 2, i // ROWS) for i in range(ROWS * FILES)]


def test_an_empty_first_batch_is_collected_and_the_stream_goes_on(
    spark: Any, pg_db: str, tmp_path: Path
) -> None:
    """Nothing to collect in the first epoch: the store's table is made from Spark's schema."""
    _inbox(tmp_path)
    history = _run(spark, pg_db, tmp_path, transform=lambda batch: batch.filter(f"id >= {ROWS}"))
    assert [b.rows for b in history] == [{"events": 0}, {"events": ROWS}]
    assert [b.via for b in history] == [{"events": "collect"}] * FILES
    assert _events(pg_db) == [(i, i * 2, 1) for i in range(ROWS, 2 * ROWS)]


def test_batches_that_take_different_ways_land_alike(
    spark: Any, pg_db: str, tmp_path: Path
) -> None:
    """One batch collected, the next staged on the executors: one schema, the same values."""
    from pyspark.sql import functions as F

    from expected_state.store import ExpectedStateStore
    from reconcile.core.hashing import row_hash_arrow

    def dressed(batch: Any) -> Any:
        return batch.select(
            "id", "amount",
            F.concat(F.lit("note-"), F.col("id").cast("string")).alias("note"),
            F.timestamp_seconds(F.col("id") * 3600).alias("at"),
            (F.col("amount") / F.lit(4)).cast("decimal(12,2)").alias("share"),
        )  # fmt: skip

    sizes = _inbox(tmp_path, pad=(0, 20))  # the second file is the larger
    assert sizes[0] < sizes[1]
    history = _run(
        spark, pg_db, tmp_path, transform=dressed, collect_max_bytes=sizes[0],
        table="CREATE TABLE events (id bigint PRIMARY KEY, amount bigint, note text, "
              "at timestamptz, share numeric(12,2), _epoch bigint)",
    )  # fmt: skip
    assert [b.via for b in history] == [{"events": "collect"}, {"events": "executors"}]
    with psycopg.connect(pg_db) as conn:
        got = conn.execute(
            "SELECT id, amount, note, at, share, _epoch FROM events ORDER BY id"
        ).fetchall()
    assert [tuple(r) for r in got] == [
        (i, i * 2, f"note-{i}", dt.datetime.fromtimestamp(i * 3600, dt.UTC),
         Decimal(i * 2) / 4, i // ROWS)
        for i in range(ROWS * FILES)
    ]  # fmt: skip
    store = ExpectedStateStore(str(tmp_path / "store"), "shop", "events", ["id"])
    snapshot = store.snapshot().sort_by("id")
    assert snapshot.column("note").to_pylist() == [f"note-{i}" for i in range(ROWS * FILES)]
    assert snapshot.schema.field("at").type == pa.timestamp("us", tz="UTC")
    # Every stored row hash is the canonical one of the row as stored: the collected
    # batch's was computed on the driver, the executors' batch's by Spark in the JVM.
    user = store.user_schema.names  # type: ignore[union-attr]
    assert snapshot.column("_row_hash").to_pylist() == row_hash_arrow(snapshot, user).to_pylist()


@pytest.mark.parametrize("via", ["auto", "executors"])
def test_arrow_rows_a_transform_made_on_the_driver_land_as_they_are(
    spark: Any, pg_db: str, tmp_path: Path, via: str
) -> None:
    """A transform may return a pyarrow.Table: whatever ``via``, nothing more is staged.

    The first batch's table is empty (with its schema), and each row's amount
    is one the driver computed, not Spark: the rows in Postgres are the ones
    the transform returned, each once, under its batch's epoch.
    """
    import pyarrow.compute as pc

    def made(batch: Any, batch_id: int) -> pa.Table:
        rows = batch.filter(f"id >= {ROWS}").toArrow()
        return rows.set_column(1, "amount", pc.add(rows["amount"], 1000 * (batch_id + 1)))

    _inbox(tmp_path)
    history = _run(spark, pg_db, tmp_path, transform=made, via=via)
    assert [b.via for b in history] == [{"events": "arrow"}] * FILES
    assert [b.rows for b in history] == [{"events": 0}, {"events": ROWS}]
    assert _events(pg_db) == [(i, i * 2 + 2000, 1) for i in range(ROWS, 2 * ROWS)]


def test_collected_timestamps_carry_the_session_time_zone(spark: Any) -> None:
    """As on the other ways, where Spark's Arrow batches carry the session's zone."""
    from reconcile.spark.staging import collect_rows

    before = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "Europe/Paris")
    try:
        frame = spark.createDataFrame([(1,)], "id long").selectExpr(
            "id", "timestamp'2026-11-25 12:00:00' AS at"
        )
        table = collect_rows(frame, batch_id=0, sink="events")
        assert table is not None
        assert table.schema.field("at").type == pa.timestamp("us", tz="Europe/Paris")
        instant = table.column("at")[0].as_py()
    finally:
        spark.conf.set("spark.sql.session.timeZone", before)
    assert instant == dt.datetime(2026, 11, 25, 11, 0, tzinfo=dt.UTC)
