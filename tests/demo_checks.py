"""What the demo tests read from PostgreSQL itself: the sinks against TPC-H, computed here.

The expected values come from the generated Parquet files through pandas, not
from the demo's own audit (``reconcile.demo.tpch.summary``), so a bug in the
audit cannot hide a lost row or a total counted twice.
"""

from __future__ import annotations

import json
import subprocess
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pyarrow.parquet as pq
from psycopg import sql

from tests.fix_pg import markers_table

REPO = Path(__file__).resolve().parents[1]


def demo_command(dsn: str, workdir: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "reconcile.cli", "demo", "--pg", dsn, "--workdir",
            str(workdir), "--json", *extra]  # fmt: skip


def run_demo(dsn: str, workdir: Path, *extra: str, timeout: float = 600) -> dict[str, Any]:
    """Run ``reconcile demo`` to the end; its JSON summary (the exit code must be 0)."""
    done = subprocess.run(demo_command(dsn, workdir, *extra), capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)  # fmt: skip
    assert done.returncode == 0, f"demo failed ({done.returncode}):\n{done.stderr[-5000:]}"
    summary: dict[str, Any] = json.loads(done.stdout)
    return summary


def batches_of_files(workdir: Path) -> dict[str, int]:
    """File name -> the micro-batch that read it, from Spark's own checkpoint.

    The file source's log gives each file the source's log offset that listed
    it; the offset log gives each micro-batch the source offset it read up to.
    Batch b reads the entries after batch b-1's offset up to its own. The two
    numberings agree until a driver dies between writing them: then a restart
    lists new files under the next log offset, and one batch may read two.
    """
    listed: dict[str, int] = {}  # file -> source log offset
    for log in (workdir / "checkpoint" / "sources" / "0").iterdir():
        if log.name.startswith("."):
            continue
        for line in log.read_text().splitlines()[1:]:  # after the "v1" header
            entry = json.loads(line)
            listed[Path(entry["path"]).name] = int(entry["batchId"])
    ends: dict[int, int] = {}  # micro-batch -> the source offset it read up to
    for log in (workdir / "checkpoint" / "offsets").iterdir():
        if log.name.isdigit():
            ends[int(log.name)] = json.loads(log.read_text().splitlines()[2])["logOffset"]
    order = sorted(ends.items())
    return {
        name: next(batch for batch, end in order if end >= offset)
        for name, offset in listed.items()
    }


def assert_sinks_exact(dsn: str, workdir: Path, epochs: int) -> None:
    """Every line once under the epoch of its file's batch, every total as TPC-H adds it up."""
    tpch = workdir / "tpch"
    lines = pq.read_table(tpch / "lineitem.parquet",
                          columns=["l_orderkey", "l_linenumber", "l_extendedprice",
                                   "l_discount"]).to_pandas()  # fmt: skip
    orders = pq.read_table(tpch / "orders.parquet", columns=["o_orderkey", "o_custkey"])
    files = sorted((workdir / "inbox").glob("lineitem-*.parquet"))
    assert len(files) == epochs
    batch_of = batches_of_files(workdir)
    assert sorted(batch_of) == [f.name for f in files]  # Spark read every file
    epoch_of: dict[tuple[int, int], int] = {}
    for path in files:
        part = pq.read_table(path, columns=["l_orderkey", "l_linenumber"])
        for key in zip(part.column(0).to_pylist(), part.column(1).to_pylist(), strict=True):
            epoch_of[key] = batch_of[path.name]
    assert len(epoch_of) == len(lines)  # the files cover lineitem, each line once

    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT l_orderkey, l_linenumber, _epoch FROM public.demo_lineitem"
        ).fetchall()
        revenue = conn.execute(
            "SELECT o_custkey, revenue, lines FROM public.demo_customer_revenue"
        ).fetchall()
        table = markers_table(conn)
        assert table is not None, "no marker table: no epoch reached a sink"
        markers = conn.execute(
            sql.SQL(
                "SELECT sink, epoch, count(*) FROM {} WHERE pipeline = 'demo' GROUP BY 1, 2"
            ).format(table)
        ).fetchall()
    assert len(rows) == len(lines), f"{len(rows)} lines in Postgres, {len(lines)} in TPC-H"
    assert {(k, n): e for k, n, e in rows} == epoch_of  # each once, under its own epoch

    joined = lines.merge(orders.to_pandas(), left_on="l_orderkey", right_on="o_orderkey")
    joined["rev"] = [p * (1 - d) for p, d in zip(joined.l_extendedprice, joined.l_discount,
                                                  strict=True)]  # fmt: skip
    want = {
        int(cust): (sum(group.rev, Decimal(0)), len(group))
        for cust, group in joined.groupby("o_custkey")
    }
    got = {cust: (rev, n) for cust, rev, n in revenue}
    assert got == want
    sinks = ("demo_lineitem", "demo_customer_revenue")
    assert sorted((s, e) for s, e, _ in markers) == sorted(
        (s, e) for s in sinks for e in set(batch_of.values())
    )
    assert all(n == 1 for _, _, n in markers)
