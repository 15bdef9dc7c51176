"""Benchmark at scale: a full verify of TPC-H lineitem in bounded memory, and a day of epochs.

One command (``python -m benchmarks.scale``; ``--quick`` for a smoke run of a
minute) writes ``benchmarks/results/scale.{json,md}`` and plots:

- ``verify_60m``: TPC-H ``lineitem`` at ``--tpch-scale`` (10: about 60M rows,
  16 columns) written into PostgreSQL through the Postgres sink, epoch by
  epoch, with its expected state. Each figure is measured in a fresh process
  (``scale_measure.py``), so that its peak RSS is its own: a binary COPY-out of
  the table, a full verify in parts (``--chunk-rows``), a full verify in
  memory (only where the table fits, ``--in-memory-max-rows``), buckets mode
  with a kept summary, scoped recovery of 1,000 divergent rows against
  full mode, and the Spark verify job on ``local[2]`` and on
  ``local-cluster[2,1,1024]`` (two executor JVMs).
- ``store_day``: ``--epochs`` (86,400: one a second for a day) epochs of 100
  rows (half updates) into a store, with ``maintain()`` after each as a
  pipeline runs it: commit latency over the first and last 10,000 epochs, RSS
  at start and end, the time to open the store at the end, the disk used.
- ``stream_sf1``: TPC-H at ``--stream-scale`` (1) through the demo pipeline
  at saturation, at each ``--batch-rows``, in four modes
  (``scale_stream.py``), and the two throughput ratios to at-least-once.

``--parts`` runs some of the three; the others are carried over from the
report already in ``--out``, each with the time it was measured (``when``).

It starts its own throwaway PostgreSQL (fsync on) and reports the machine.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.report import RESULTS, machine, now, versions, write_report  # noqa: E402
from benchmarks.scale.carry import (  # noqa: E402
    PARTS,
    VERIFY_STEPS,
    carried,
    previous,
    with_carried_steps,
)
from benchmarks.scale.day import bench_store_day  # noqa: E402
from benchmarks.scale.report import markdown, plot  # noqa: E402
from benchmarks.scale.stream import ratios, stream_sf1  # noqa: E402
from expected_state.store import ExpectedStateStore  # noqa: E402
from reconcile.core.contract import OK, SinkTxnId  # noqa: E402
from reconcile.demo.embedded_pg import EmbeddedPostgres  # noqa: E402
from reconcile.demo.tpch.data import SINK_TABLES_SQL, generate, plain_strings  # noqa: E402
from sinks.postgres.sink import PostgresSink  # noqa: E402

TABLE = "demo_lineitem"
KEYS = ["l_orderkey", "l_linenumber"]
MASTERS = {"local": "local[2]", "local_cluster": "local-cluster[2,1,1024]"}


def load_lineitem(dsn: str, store_root: str, lineitem: Path, epoch_rows: int) -> dict[str, Any]:
    """Lineitem into the sink table and the store, one epoch per ``epoch_rows`` rows."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(SINK_TABLES_SQL[0])
        conn.execute(f"CREATE INDEX ON {TABLE} (_epoch)")
    sink = PostgresSink(dsn, TABLE, name=TABLE, pipeline="bench")
    store: ExpectedStateStore | None = None
    epoch, rows, start = 0, 0, time.perf_counter()
    for piece in pq.ParquetFile(lineitem).iter_batches(batch_size=epoch_rows):
        data = plain_strings(pa.Table.from_batches([piece]))
        if store is None:
            store = ExpectedStateStore(store_root, "bench", TABLE, KEYS, schema=data.schema)
        store.apply(epoch, data.append_column("_op", pa.array(["upsert"] * data.num_rows)))
        txn = SinkTxnId("bench", TABLE, epoch, 0)
        if not (sink.stage(txn, data) == OK and sink.prepare(txn) == OK
                and sink.commit(txn) == OK):  # fmt: skip
            raise RuntimeError(f"epoch {epoch} did not commit into {TABLE}")
        epoch += 1
        rows += data.num_rows
        print(f"  loaded epoch {epoch - 1}: {rows:,} rows", flush=True)
    sink.close()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"VACUUM ANALYZE {TABLE}")
        conn.execute("CHECKPOINT")
    return {"rows": rows, "epochs": epoch, "load_s": round(time.perf_counter() - start, 1)}


def measure(*args: str) -> dict[str, Any]:
    """One action in a fresh process (``scale_measure.py``): its JSON line."""
    cmd = [sys.executable, "-m", "benchmarks.scale.measure", *args]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args[:1])} failed: {done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def bench_verify(dsn: str, root: str, args: argparse.Namespace) -> dict[str, Any]:
    # A folder given by --tpch-dir is kept between runs: scale 10 takes minutes to generate.
    tpch = generate(args.tpch_dir or Path(root) / "tpch", args.tpch_scale)
    store_root = str(Path(root) / "store")
    loaded = load_lineitem(dsn, store_root, tpch / "lineitem.parquet", args.epoch_rows)
    spill = Path(root) / "spill"
    spill.mkdir()
    base = ["--dsn", dsn, "--table", TABLE, "--store", store_root, "--spill-dir", str(spill)]
    out: dict[str, Any] = {"tpch_scale": args.tpch_scale, **loaded, "columns": 16,
                           "chunk_rows": args.chunk_rows}  # fmt: skip
    steps = set(args.verify_steps.split(","))
    if "full" in steps:
        out.update(_full(base, loaded["rows"], args))
    if "buckets" in steps:
        # The first check computes and keeps the summary; the second uses it.
        out["buckets_first"] = measure("verify", *base, "--mode", "buckets", *_chunked(args))
        out["buckets_kept_summary"] = measure("verify", *base, "--mode", "buckets", *_chunked(args))
    if "scoped" in steps:
        out.update(_scoped(base, store_root, loaded["epochs"], tpch, args))
    if "spark" in steps:
        # The Spark job in a driver process of its own, its memory over its whole tree;
        # each reader of the store side by side on the same data, one after the other.
        job = ["--partitions", str(args.spark_parts)]
        out["spark"] = {
            f"{name}_{reader}": measure(
                "spark", *base, "--master", MASTERS[name], *job, "--store-reader", reader
            )
            for name in args.spark_masters.split(",")
            for reader in args.spark_readers.split(",")
        }
    leftovers = list(spill.iterdir())
    if leftovers:
        raise RuntimeError(f"the spill folder was not emptied: {leftovers[:3]}")
    return out


def _chunked(args: argparse.Namespace) -> list[str]:
    return ["--chunk-rows", str(args.chunk_rows)]


def _full(base: list[str], rows: int, args: argparse.Namespace) -> dict[str, Any]:
    """COPY-out (the better of two) against a full verify in parts, and in memory where it fits."""
    out: dict[str, Any] = {}
    out["copy_out"] = min((measure("copy", *base) for _ in range(2)), key=lambda r: r["seconds"])
    chunked = _chunked(args)
    out["full_in_parts"] = measure("verify", *base, "--mode", "full", *chunked)
    if rows <= args.in_memory_max_rows:
        whole = ["--chunk-rows", str(10**12)]
        out["full_in_memory"] = measure("verify", *base, "--mode", "full", *whole)
    else:
        out["full_in_memory"] = {"skipped": f"more than {args.in_memory_max_rows:,} rows"}
    out["full_vs_copy_ratio"] = round(
        out["copy_out"]["seconds"] / out["full_in_parts"]["seconds"], 3
    )
    return out


def _scoped(
    base: list[str], store_root: str, epochs: int, tpch: Path, args: argparse.Namespace
) -> dict[str, Any]:
    """Scoped against full mode, once the store records an epoch of 1,000 rows the sink lacks."""
    out: dict[str, Any] = {}
    out["divergent_rows"] = record_divergent(store_root, epochs, tpch / "lineitem.parquet", 1000)
    out["scoped_divergent"] = measure("verify", *base, "--mode", "scoped", *_chunked(args))
    out["full_divergent"] = measure("verify", *base, "--mode", "full", *_chunked(args))
    out["scoped_vs_full_ratio"] = round(
        out["scoped_divergent"]["seconds"] / out["full_divergent"]["seconds"], 4
    )
    return out


def record_divergent(store_root: str, epoch: int, lineitem: Path, count: int) -> int:
    """Epoch ``epoch`` in the store only: ``count`` lines, half changed, half new orders.

    The lines changed are drawn from the orders below 400,000 (a range read of
    the store, about 100,000 lines at any scale), never from the whole
    snapshot, which at scale 10 would not fit in memory beside the rest.
    """
    store = ExpectedStateStore(store_root, "bench", TABLE, KEYS)
    columns = store.user_schema.names  # type: ignore[union-attr]
    current = store.snapshot(columns=columns, ranges=[(None, 400_000)])
    rng = np.random.default_rng(7)
    picked = current.take(pa.array(rng.choice(current.num_rows, count // 2, replace=False)))
    changed = picked.set_column(
        picked.schema.get_field_index("l_comment"), "l_comment",
        pa.array(["changed by the benchmark"] * picked.num_rows),
    )  # fmt: skip
    fresh = current.slice(0, count - count // 2)
    top = int(pc.max(pq.read_table(lineitem, columns=["l_orderkey"]).column(0)).as_py())
    orderkeys = pa.array(np.arange(top + 1, top + 1 + fresh.num_rows))
    fresh = fresh.set_column(0, "l_orderkey", orderkeys)
    data = pa.concat_tables([changed, fresh.cast(changed.schema)])
    store.apply(epoch, data.append_column("_op", pa.array(["upsert"] * data.num_rows)))
    del current
    gc.collect()
    return data.num_rows


def run(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="reconcile-bench-scale-", dir=args.workdir))
    parts = set(args.parts.split(","))
    before = previous(args.out)  # the report whose figures the parts not run keep
    result: dict[str, Any] = {
        "machine": machine(),
        "versions": versions(
            "pyarrow", "deltalake", "psycopg", "adbc-driver-postgresql", "pyspark"
        ),
        "when": now(),
        "quick": args.quick,
        **carried(before, parts),
    }
    if "stream" in parts:
        result["stream_sf1"] = {**stream_sf1(args, work), "when": now()}
    result["eo_vs_alo_rows_per_s_min"], result["executors_vs_alo_rows_per_s_min"] = ratios(
        result["stream_sf1"]
    )
    if "verify" in parts:
        server = EmbeddedPostgres(fsync="on", shared_buffers="1GB", max_wal_size="8GB",
                                  work_mem="256MB")  # fmt: skip
        try:
            dsn = server.dsn(server.create_database("bench"))
            measured = {**bench_verify(dsn, str(work), args), "when": now()}
            steps = set(args.verify_steps.split(","))
            result["verify_60m"] = with_carried_steps(measured, steps, before)
        finally:
            server.stop()
    if "day" in parts:
        day = bench_store_day(work / "day", args.epochs, args.window)
        result["store_day"] = {**day, "when": now()}
    shutil.rmtree(work, ignore_errors=True)
    return result


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _any_of(known: Iterable[str], what: str) -> Callable[[str], str]:
    """An argparse type: a comma-separated list of ``known`` names ``what`` names."""
    names = list(known)

    def check(text: str) -> str:
        unknown = set(text.split(",")) - set(names)
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown {what} {sorted(unknown)}: any of {names}")
        return text

    return check


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tpch-scale", type=float, default=10.0)
    parser.add_argument(
        "--tpch-dir", type=Path, default=None, help="where TPC-H is generated once and kept"
    )
    parser.add_argument("--epoch-rows", type=int, default=5_000_000, help="lineitem rows per epoch")
    parser.add_argument("--chunk-rows", type=int, default=1_000_000)
    parser.add_argument("--in-memory-max-rows", type=int, default=20_000_000)
    parser.add_argument(
        "--spark-parts", type=int, default=8, help="the Spark job's pull partitions"
    )
    parser.add_argument(
        "--verify-steps",
        default=",".join(sorted(VERIFY_STEPS)),
        type=_any_of(sorted(VERIFY_STEPS), "steps"),
        help="verify_60m's steps to run (the others are carried over)",
    )
    parser.add_argument(
        "--spark-readers", default="files,delta-spark", help="the store readers timed, in turn"
    )
    parser.add_argument(
        "--spark-masters",
        default="local,local_cluster",
        type=_any_of(MASTERS, "masters"),
        help="the masters the job is timed on",
    )
    parser.add_argument("--epochs", type=int, default=86_400, help="store_day's epochs")
    parser.add_argument("--window", type=int, default=10_000, help="first/last epochs compared")
    parser.add_argument("--workdir", default=None, help="where the data goes (default: /tmp)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--stream-scale", type=float, default=1.0, help="stream_sf1's TPC-H scale")
    parser.add_argument(
        "--batch-rows",
        type=_ints,
        default=[60_000, 600_000],
        help="stream_sf1's lineitem rows per micro-batch, comma-separated",
    )
    parser.add_argument("--stream-master", default="local[2,4]", help="stream_sf1's Spark master")
    parser.add_argument(
        "--stream-timeout", type=float, default=3600.0, help="seconds one streaming run may take"
    )
    parser.add_argument(
        "--parts",
        default="stream,verify,day",
        type=_any_of(PARTS, "parts"),
        help="which of stream, verify, day to run (the others are carried over)",
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run of a few minutes")
    args = parser.parse_args(argv)
    if args.quick:
        args.tpch_scale, args.epoch_rows, args.chunk_rows = 0.01, 20_000, 10_000
        args.epochs, args.window = 300, 100
        args.stream_scale, args.batch_rows = 0.01, [6_000, 20_000]
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    result = run(args)
    write_report("scale", result, markdown(result), args.out)
    plot(result, args.out)
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
