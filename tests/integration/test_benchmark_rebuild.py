"""The rebuild benchmark: its reader and counters on a real server, and its one command run small.

The figures are not asserted (targets belong to the benchmark's own run, and a
test never asserts a wall-clock time); what is asserted is what the benchmark
measures with: a lock on the table shows as a gap and as failed reads, a table
without its rows shows as reads that found none, the row counters rise by
what was written and no more, and the quick run's report has its keys, with the
rebuild's rows written within 1.1x of the rows the new logic changed (how the
engine behaves, not how fast).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import psycopg
import pytest

from benchmarks.rebuild import bench as rebuild
from benchmarks.rebuild.measure import (
    TABLE,
    Reader,
    copy_rows,
    logic_state,
    settled_writes,
    with_epoch,
    written,
)

pytestmark = [pytest.mark.integration]

ROWS = 2_000


def _table(dsn: str) -> None:
    with psycopg.connect(dsn) as conn:
        conn.execute(
            f"CREATE TABLE {TABLE} (k bigint PRIMARY KEY, v bigint, w text, _epoch bigint)"
        )
        copy_rows(conn, TABLE, with_epoch(logic_state(ROWS, None), 1))


def test_a_lock_on_the_table_is_a_gap_and_failed_reads(pg_db: str) -> None:
    _table(pg_db)
    with Reader(pg_db, ROWS) as reader, psycopg.connect(pg_db) as conn:
        conn.execute(f"LOCK TABLE {TABLE} IN ACCESS EXCLUSIVE MODE")
        time.sleep(0.6)
        conn.commit()
    figures = reader.figures
    assert figures["longest_gap_s"] >= 0.55
    assert figures["failed"].get("55P03", 0) >= 3  # lock_timeout, again and again
    assert figures["missing"] == 0 and figures["found"] > 0


def test_an_emptied_table_is_reads_that_found_no_row(pg_db: str) -> None:
    _table(pg_db)
    with Reader(pg_db, ROWS) as reader, psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute(f"DELETE FROM {TABLE} WHERE k >= 0")
        time.sleep(0.3)
        copy_rows(conn, TABLE, with_epoch(logic_state(ROWS, None), 1))
    assert reader.figures["missing"] >= 5
    assert reader.figures["found"] > 0


def test_the_counters_rise_by_the_rows_written_in_each_table(pg_db: str) -> None:
    _table(pg_db)
    before = settled_writes(pg_db)
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute(f"UPDATE {TABLE} SET v = v + 1 WHERE k % 100 = 0")  # 20 rows
        conn.execute(f"DELETE FROM {TABLE} WHERE k IN (1, 2)")
        conn.execute("CREATE TABLE side (k bigint)")
        conn.execute("INSERT INTO side SELECT generate_series(1, 3)")
        conn.execute("CREATE TABLE untouched (k bigint)")
        conn.execute("SELECT pg_stat_force_next_flush()")
    rises = written(before, settled_writes(pg_db))
    assert rises == {
        f"public.{TABLE}": {"inserted": 0, "updated": 20, "deleted": 2},
        "public.side": {"inserted": 3, "updated": 0, "deleted": 0},
    }


@pytest.mark.slow
def test_quick_run_reports_both_ratios_and_the_rebuild_writes_only_the_changed_rows(
    tmp_path: Path,
) -> None:
    assert rebuild.main(["--quick", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "rebuild.json").read_text())
    assert {"rows_written_vs_changed", "time_vs_truncate_reload", "methods", "scale",
            "machine"} <= set(report)  # fmt: skip
    scale, methods = report["scale"], report["methods"]
    assert scale["rows"] == 50_000 and scale["changed_rows"] == 500
    assert set(methods) == {"truncate_reload", "side_table_swap", "rebuild"}
    for name, method in methods.items():
        assert method["sink_matches_new_logic"] is True, name
        assert method["seconds"] > 0 and method["reader"]["found"] > 0, name
    by = methods["rebuild"]
    assert by["plan"] == {"inserts": 0, "updates": 500, "deletes": 0, "changed": 500}
    assert by["step"] == "switched" and by["how"] == "diff" and by["applied"] == 500
    assert scale["changed_rows"] <= by["rows_written"] <= 1.1 * scale["changed_rows"]
    assert report["rows_written_vs_changed"] <= 1.1
    # The two full reloads write every row: the counters see them.
    assert methods["truncate_reload"]["rows_written"] >= 50_000
    assert methods["side_table_swap"]["rows_written"] >= 50_000
    assert "## Targets" in (tmp_path / "rebuild.md").read_text()
    assert (tmp_path / "rebuild.png").stat().st_size > 10_000


def test_the_state_check_reads_every_row_of_the_server(pg_db: str) -> None:
    with psycopg.connect(pg_db) as conn:
        conn.execute(
            f"CREATE TABLE {TABLE} (k bigint PRIMARY KEY, v bigint, w text, _epoch bigint)"
        )
        copy_rows(conn, TABLE, with_epoch(logic_state(ROWS, 100), 2))
    assert rebuild.matches_new_logic(pg_db, ROWS, 100)
    assert not rebuild.matches_new_logic(pg_db, ROWS, 50)  # other keys changed
    assert not rebuild.matches_new_logic(pg_db, ROWS + 1, 100)  # a key short
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute(f"UPDATE {TABLE} SET w = NULL WHERE k = 7")  # NULL from the server
    assert not rebuild.matches_new_logic(pg_db, ROWS, 100)
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute(f"UPDATE {TABLE} SET w = 'r7' WHERE k = 7")
        conn.execute(f"UPDATE {TABLE} SET v = v - 1 WHERE k = 1900")  # one old value left
    assert not rebuild.matches_new_logic(pg_db, ROWS, 100)
