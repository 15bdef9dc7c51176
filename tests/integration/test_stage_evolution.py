"""A micro-batch that brings a new column, on every staging path: the table and the store evolve.

The streaming writer's ``foreachBatch`` function is called with real Spark
DataFrames (a micro-batch is one), into a real Postgres table with an
expected state. On the executor path (``via="executors"``) and on the default
one (``via="auto"``, which plans the executor path whatever it picks), the
batch that brings a column the table lacks goes the driver's way, whose epoch
adds the column under the fence; the batches after it are staged on the
executors again, into a staging table of the new columns. Read back from
Postgres (columns, rows, the staging tables) and by a verify.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest

from reconcile import CommitCycle, recover
from reconcile.engine.expected import ExpectedState
from reconcile.spark.stream import StreamWriter
from sinks.postgres.factory import postgres_sink

pytestmark = pytest.mark.integration


def _columns(dsn: str) -> list[str]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'items' "
            "ORDER BY ordinal_position"
        ).fetchall()
    return [r[0] for r in rows]


def _staging_tables(dsn: str) -> list[tuple[str, ...]]:
    """The executors' staging tables, by their columns (the engine's schema)."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT c.relname, array_agg(a.attname ORDER BY a.attnum) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace JOIN pg_attribute a "
            "ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped "
            "WHERE n.nspname = 'reconcile' AND c.relkind = 'r' "
            "AND c.relname LIKE '\\_reconcile\\_stage\\_%' "
            "GROUP BY c.relname"
        ).fetchall()
    return sorted(tuple(r[1]) for r in rows)


@pytest.mark.parametrize("via", ["executors", "auto"])
def test_a_new_column_on_the_executor_staging_path(
    spark: Any, pg_db: str, tmp_path: Path, via: str
) -> None:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id bigint PRIMARY KEY, qty bigint, _epoch bigint)")
    root = str(tmp_path / "store")

    def build() -> CommitCycle:
        expected = ExpectedState(root, "shop", {"items": ["id"]})
        return CommitCycle("shop", [postgres_sink(pg_db, "items", name="items")],
                           expected_state=expected)  # fmt: skip

    writer = StreamWriter(build, staging=str(tmp_path / "staging"), via=via)
    plain = "id long, qty long"
    labelled = "id long, qty long, label string"
    try:
        writer(spark.createDataFrame([(i, i * 3) for i in range(10)], plain), 0)
        writer(spark.createDataFrame([(i, i * 5, f"l{i}") for i in range(5, 15)], labelled), 1)
        writer(spark.createDataFrame([(i, i * 7, f"m{i}") for i in range(12, 20)], labelled), 2)
    finally:
        writer.close()
    vias = [stats.via["items"] for stats in writer.history]
    if via == "executors":
        # The batch that brings the column goes the driver's way; the next is staged again.
        assert vias == ["executors", "driver", "executors"]
        assert _staging_tables(pg_db) == [
            ("id", "qty", "_reconcile_epoch", "_reconcile_task"),
            ("id", "qty", "label", "_reconcile_epoch", "_reconcile_task"),
        ]
    else:
        # Collected if Spark sizes the batch as small; never staged on the executors.
        assert vias[1] in ("collect", "driver")
    assert _columns(pg_db) == ["id", "qty", "_epoch", "label"]
    with psycopg.connect(pg_db) as conn:
        rows = dict(
            (r[0], (r[1], r[2]))
            for r in conn.execute("SELECT id, qty, label FROM items").fetchall()
        )
    expected: dict[int, tuple[int, str | None]] = {i: (i * 3, None) for i in range(10)}
    expected |= {i: (i * 5, f"l{i}") for i in range(5, 15)}
    expected |= {i: (i * 7, f"m{i}") for i in range(12, 20)}
    assert rows == expected
    report = recover(pg_db, root, "shop", "items", mode="full", dry_run=True)
    assert (report.rows_pulled, report.missing, report.extra, report.changed) == (20, 0, 0, 0)
