"""``reconcile demo --source kafka``: TPC-H lineitem through a real broker, under chaos.

The demo starts its own broker from the cached JARs, produces lineitem into a
topic slice by slice, and its pipeline reads the topic with Spark's Kafka
connector while chaos kills it (at the two points a checkpoint-bound sink
cannot survive) and drops connections around COMMIT. Afterwards PostgreSQL is
read directly: every TPC-H line once, every customer's revenue as TPC-H adds it
up, one marker per sink and epoch; and the store holds, for every epoch, the
offset ranges it read: together they cover each record of the topic once.
"""

from __future__ import annotations

from collections import Counter
from decimal import Decimal
from pathlib import Path

import psycopg
import pyarrow.parquet as pq
import pytest
from psycopg import sql

from expected_state.source_offsets import SourceOffsets
from reconcile.demo.tpch.kafka_source import TOPIC
from reconcile.demo.tpch.pipeline import PIPELINE
from tests.demo_checks import demo_command, run_demo
from tests.fix_pg import markers_table

pytestmark = [pytest.mark.integration, pytest.mark.chaos, pytest.mark.timeout(1200)]


@pytest.mark.slow  # the demo with a broker and Spark in subprocesses: minutes
@pytest.mark.spark  # in a subprocess
def test_a_kafka_fed_demo_under_chaos_writes_every_line_once(pg_db: str, tmp_path: Path) -> None:
    workdir = tmp_path / "demo"
    summary = run_demo(pg_db, workdir, "--source", "kafka", "--epochs", "4", "--chaos", "3",
                       "--crashes", "2", "--drop-rate", "0.5", "--interval", "0.5",
                       timeout=1100)  # fmt: skip
    kills = sorted((workdir / "kills").iterdir())
    assert summary["crashes"] == len(kills) == 2  # the kills fired
    assert summary["settings"]["source"] == "kafka"
    assert summary["verified"] is True

    tpch = workdir / "tpch"
    lines = pq.read_table(tpch / "lineitem.parquet",
                          columns=["l_orderkey", "l_linenumber", "l_extendedprice",
                                   "l_discount"]).to_pandas()  # fmt: skip
    orders = pq.read_table(tpch / "orders.parquet", columns=["o_orderkey", "o_custkey"])
    with psycopg.connect(pg_db) as conn:
        rows = conn.execute("SELECT l_orderkey, l_linenumber, _epoch FROM demo_lineitem").fetchall()
        revenue = conn.execute(
            "SELECT o_custkey, revenue, lines FROM demo_customer_revenue"
        ).fetchall()
        table = markers_table(conn)
        assert table is not None
        markers = conn.execute(
            sql.SQL(
                "SELECT sink, epoch, count(*) FROM {} WHERE pipeline = %s GROUP BY 1, 2"
            ).format(table),
            (PIPELINE,),
        ).fetchall()
    assert len(rows) == len(lines)  # every line once (the key is the primary key)
    assert {(k, n) for k, n, _ in rows} == set(
        zip(lines.l_orderkey.tolist(), lines.l_linenumber.tolist(), strict=True)
    )
    joined = lines.merge(orders.to_pandas(), left_on="l_orderkey", right_on="o_orderkey")
    want: dict[int, tuple[Decimal, int]] = {}
    for cust, price, discount in zip(joined.o_custkey, joined.l_extendedprice, joined.l_discount,
                                     strict=True):  # fmt: skip
        total, count = want.get(int(cust), (Decimal(0), 0))
        want[int(cust)] = (total + price * (1 - discount), count + 1)
    assert {cust: (rev, n) for cust, rev, n in revenue} == want
    assert all(n == 1 for _, _, n in markers)

    # Each epoch's offset ranges, as the store recorded them before its decision:
    # per partition they follow each other from offset 0, and together they hold
    # every produced record once (an idempotent producer: one offset a record).
    epochs = {e for _, _, e in rows}
    ranges = SourceOffsets(str(workdir / "expected_state"), PIPELINE).ranges(max(epochs))
    assert epochs <= set(ranges)
    read: Counter[int] = Counter()
    ends: dict[int, int] = {}
    for epoch in sorted(ranges):
        for r in ranges[epoch]:
            assert r.topic == TOPIC
            assert r.from_offset == ends.get(r.partition, 0), (epoch, r)
            ends[r.partition] = r.to_offset
            read[r.partition] += r.to_offset - r.from_offset
    assert sum(read.values()) == len(lines)


def test_a_kafka_fed_run_is_not_resumed_from_its_work_folder(pg_db: str, tmp_path: Path) -> None:
    """Its broker and topic lived only as long as the run: a second run says so, exit 2."""
    import subprocess

    from tests.demo_checks import REPO

    workdir = tmp_path / "demo"
    workdir.mkdir()
    (workdir / "demo.json").write_text('{"scale": 0.01, "epochs": 2, "pg": true}')  # a run was here
    done = subprocess.run(demo_command(pg_db, workdir, "--source", "kafka", "--epochs", "2"),
                          capture_output=True, text=True, timeout=300, cwd=REPO)  # fmt: skip
    assert done.returncode == 2, done.stderr[-3000:]
    assert "cannot resume the run" in done.stderr and str(workdir) in done.stderr
