"""``reconcile demo --realtime``: lineitem through a real broker under Real-Time Mode, killed.

The demo starts its broker, produces TPC-H lineitem slice by slice, and runs its
pipeline under Spark's Real-Time Mode with the JVM writer; chaos SIGKILLs the
pipeline's process group once rows of a launch are visible (inside a long batch
whose offsets Spark has not checkpointed), and starts it again on the same
checkpoint. Afterwards PostgreSQL is read directly: every generated line once,
with its values, and the offset markers at the topic's end. The flags that belong
to the micro-batch demo are refused before anything starts.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import psycopg
import pyarrow.parquet as pq
import pytest

from reconcile.demo.tpch.realtime_pipeline import PIPELINE, SINK, TABLE
from tests.cli_run import cli
from tests.demo_checks import run_demo

pytestmark = [pytest.mark.integration, pytest.mark.chaos]


@pytest.mark.slow  # the demo with a broker and Spark in subprocesses, killed: minutes
@pytest.mark.spark  # in a subprocess
@pytest.mark.timeout(1200)
def test_a_realtime_demo_killed_mid_batch_writes_every_line_once(
    pg_db: str, tmp_path: Path
) -> None:
    workdir = tmp_path / "demo"
    summary = run_demo(pg_db, workdir, "--realtime", "--source", "kafka", "--epochs", "3",
                       "--chaos", "5", "--crashes", "1", "--interval", "1",
                       timeout=1100)  # fmt: skip
    assert summary["kills"] == 1 and summary["launches"] == 2  # the kill fired, mid-run
    assert summary["verified"] is True
    lines = pq.read_table(workdir / "tpch" / "lineitem.parquet",
                          columns=["l_orderkey", "l_linenumber"]).to_pylist()  # fmt: skip
    expected = Counter((r["l_orderkey"], r["l_linenumber"]) for r in lines)
    with psycopg.connect(pg_db) as conn:
        rows = conn.execute(f"SELECT l_orderkey, l_linenumber FROM {TABLE}").fetchall()
        markers = conn.execute(
            "SELECT sum(last_offset + 1) FROM reconcile.reconcile_realtime_offsets "
            "WHERE pipeline = %s AND sink = %s",
            (PIPELINE, SINK),
        ).fetchone()
    assert Counter(map(tuple, rows)) == expected  # none missing, none twice
    assert markers is not None and markers[0] == len(lines)  # each record, by its offset
    assert summary["rows"] == summary["expected"] == len(lines)


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--source", "files"], "--source files does not apply to --realtime"),
        (["--trigger", "1"], "--trigger does not apply to --realtime"),
        (["--via", "driver"], "--via does not apply to --realtime"),
        (["--drop-rate", "0.5"], "--drop-rate does not apply to --realtime"),
        (["--epochs", "0"], "--epochs must be >= 1"),
    ],
)
def test_the_micro_batch_demos_flags_are_refused_before_anything_starts(
    tmp_path: Path, flags: list[str], named: str
) -> None:
    done = cli("demo", "--realtime", "--workdir", str(tmp_path / "demo"), *flags)
    assert done.returncode == 2, done.stderr
    assert named in done.stderr
    assert not (tmp_path / "demo").exists()  # nothing generated, no broker started


def test_an_earlier_runs_markers_are_refused_or_reset_never_left_to_skip_records(
    pg_db: str,
) -> None:
    # The new broker's topic starts at offset 0 again under the same name: markers left by
    # an earlier run would skip that many of this run's records, which would never land.
    from reconcile.core.contract import ConfigurationError
    from reconcile.demo.tpch.realtime import _prepare
    from sinks.objects.postgres import open_realtime_offsets

    with psycopg.connect(pg_db, autocommit=True) as conn:
        markers = open_realtime_offsets(conn, "reconcile", what="test")
        conn.execute(
            psycopg.sql.SQL(
                "INSERT INTO {} (pipeline, sink, topic, kafka_partition, last_offset, generation) "
                "VALUES (%s, %s, 'demo_lineitem_in', 0, 41, 1)"
            ).format(markers),
            (PIPELINE, SINK),
        )
    with pytest.raises(ConfigurationError, match="earlier realtime demo"):
        _prepare(pg_db, reset=False)
    _prepare(pg_db, reset=True)
    with psycopg.connect(pg_db) as conn:
        left = conn.execute(
            "SELECT count(*) FROM reconcile.reconcile_realtime_offsets "
            "WHERE pipeline = %s AND sink = %s",
            (PIPELINE, SINK),
        ).fetchone()
        rows = conn.execute(f"SELECT count(*) FROM {TABLE}").fetchone()
    assert left == (0,) and rows == (0,)
