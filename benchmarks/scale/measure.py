"""One measurement of the scale benchmark, alone in a fresh process: its time and its peak RSS.

``benchmarks/scale/bench.py`` runs each verify as ``python -m benchmarks.scale.measure
ACTION ...`` so that the peak resident memory it reports (``VmHWM`` of this
process) is the action's own, not the loader's or an earlier action's. Prints
one JSON object on its last line.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def _copy_out(dsn: str, table: str) -> dict[str, Any]:
    """A binary COPY of the whole table, read and dropped: the floor a verify is held to."""
    import psycopg
    from psycopg import sql

    size = 0
    with psycopg.connect(dsn) as conn, conn.cursor() as cur:
        query = sql.SQL("COPY {} TO STDOUT (FORMAT BINARY)").format(sql.Identifier(table))
        with cur.copy(query) as copy:
            for block in copy:
                size += len(block)
    return {"bytes": size}


def _verify(args: argparse.Namespace) -> dict[str, Any]:
    from reconcile import recover

    report = recover(
        args.dsn, args.store, args.pipeline, args.table, mode=args.mode, dry_run=True,
        chunk_rows=args.chunk_rows, spill_dir=args.spill_dir,
    )  # fmt: skip
    return {
        "mode": report.mode,
        "rows_pulled": report.rows_pulled,
        "missing": report.missing,
        "extra": report.extra,
        "changed": report.changed,
        "buckets_compared": report.buckets_compared,
    }


def _spark(args: argparse.Namespace) -> dict[str, Any]:
    """The Spark verify job (``spark_recover``) on ``--master``: its time, its tree's memory.

    ``seconds`` is the whole action, Spark's start included; ``job_seconds``
    the job alone. Memory is sampled over this process's tree (``latency_cpu``:
    the driver's Python and JVM, and the Python workers and executor JVMs).
    """
    from benchmarks.latency.cpu import TreeCpu
    from reconcile.spark.session import local_session
    from reconcile.spark.verify import spark_recover

    # The machine's load when the job starts: a figure taken beside other work says so.
    load_before = round(os.getloadavg()[0], 2)
    tree = TreeCpu(every=0.5)
    tree.add_root(os.getpid())
    tree.start()
    spark = local_session("reconcile-bench-scale", args.master,
                          **{"spark.driver.memory": "4g"})  # fmt: skip
    spark.sparkContext.setLogLevel("ERROR")
    start = time.perf_counter()
    report = spark_recover(spark, args.dsn, args.store, args.pipeline, args.table,
                           partitions=args.partitions, store_reader=args.store_reader)  # fmt: skip
    job = time.perf_counter() - start
    spark.stop()
    tree.finish(linger=0.0)
    return {
        "master": args.master,
        "partitions": args.partitions,
        "store_reader": args.store_reader,
        "load_before": load_before,
        "load_after": round(os.getloadavg()[0], 2),
        "rows_pulled": report.rows_pulled,
        "missing": report.missing,
        "extra": report.extra,
        "changed": report.changed,
        "job_seconds": round(job, 3),
        "peak_mb_driver": tree.peak_mb.get("driver"),
        "peak_mb_executors": tree.peak_mb.get("executors"),
    }


def _peak_rss_kib() -> int:
    """This process's peak resident memory (VmHWM), in KiB.

    Not ``ru_maxrss``: Linux carries the parent's high-water mark into it
    across ``exec``, so a process started by a large parent reports that size.
    """
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("action", choices=["copy", "verify", "spark"])
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--table", required=True)
    parser.add_argument("--store", default="")
    parser.add_argument("--pipeline", default="bench")
    parser.add_argument("--mode", default="full")
    parser.add_argument("--chunk-rows", type=int, default=1_000_000)
    parser.add_argument("--spill-dir", default=None)
    parser.add_argument("--master", default="local[2]", help="spark: the Spark master")
    parser.add_argument("--partitions", type=int, default=4, help="spark: the pull partitions")
    parser.add_argument(
        "--store-reader", default="auto", help="spark: the store's reader (files, delta-spark)"
    )
    args = parser.parse_args(argv)
    start = time.perf_counter()
    actions = {"copy": lambda: _copy_out(args.dsn, args.table), "verify": lambda: _verify(args),
               "spark": lambda: _spark(args)}  # fmt: skip
    out = actions[args.action]()
    out["seconds"] = round(time.perf_counter() - start, 3)
    out["peak_rss_mb"] = round(_peak_rss_kib() / 1024, 1)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
