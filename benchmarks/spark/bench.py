"""Benchmark: the engine on Spark, next to the in-process engine, in one run on the same data.

``python -m benchmarks.spark [--rows N] [--batches B] [--batch-rows R] [--verify-only]``

1. **Verify.** Full verify of an N-row PostgreSQL table (default 10M): in-process
   (COPY into Arrow, numpy hash, Arrow diff) and as a Spark job
   (``spark_recover``) on ``local[2]`` with 1, 2, 4 and 8 pull partitions, and on
   ``local-cluster`` with 1 and 2 workers (executor JVMs in processes of their
   own). Every run must report no drift: the timings are of a real comparison.
   Then the same job with the expected state read by delta-spark (the
   default) and by the version's file lists, alternated, side by side.
2. **Streaming.** The same file stream (B micro-batches of R rows) written by
   ``write_stream`` (exactly-once: staged by executors, store recorded, one
   transaction per sink with its marker) and by a plain at-least-once
   ``foreachBatch`` that COPYs each batch into a table, with the default
   trigger (the next batch as soon as the last is done) and with a 1 s
   ``processingTime`` trigger. Per batch, Spark's own ``addBatch`` duration
   (the write) and ``triggerExecution`` (the whole micro-batch) are reported.

It starts its own throwaway PostgreSQL (fsync on) and writes
``benchmarks/results/spark_verify.json``, ``.md`` and ``spark_verify.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import psycopg

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from benchmarks.recovery.bench import SCHEMA, Sink  # noqa: E402
from benchmarks.report import RESULTS, machine, now, versions, write_report  # noqa: E402
from benchmarks.spark.report import READER_ROUNDS, markdown, plot  # noqa: E402
from reconcile import CommitCycle, recover  # noqa: E402
from reconcile.demo.embedded_pg import EmbeddedPostgres  # noqa: E402
from reconcile.engine.expected import ExpectedState  # noqa: E402
from reconcile.spark.session import local_session  # noqa: E402

PARTITIONS = (1, 2, 4, 8)
WORKERS = (1, 2)
READERS = ("delta-spark", "files")  # spark_recover's store_reader, side by side


def session(master: str) -> Any:
    spark = local_session(
        "reconcile-bench",
        master,
        **{"spark.sql.shuffle.partitions": "8", "spark.driver.memory": "4g"},
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def timed_spark_verify(
    spark: Any, dsn: str, root: str, table: str, parts: int, reader: str = "auto"
) -> float:
    from reconcile.spark.verify import spark_recover

    start = time.perf_counter()
    report = spark_recover(spark, dsn, root, "bench", table, partitions=parts,
                           store_reader=reader)  # fmt: skip
    seconds = time.perf_counter() - start
    assert not report.drift, report
    return seconds


def verify_part(args: argparse.Namespace, dsn: str, root: str, out: dict[str, Any]) -> None:
    t = time.perf_counter()
    sink = Sink(dsn, root, "big", args.rows)
    print(f"loaded {args.rows} rows in {time.perf_counter() - t:.1f}s", flush=True)
    local = []
    for _ in range(2):
        start = time.perf_counter()
        report = recover(dsn, root, "bench", sink.table, mode="full", dry_run=True)
        local.append(time.perf_counter() - start)
        assert not report.drift, report
    out["in_process_s"] = round(min(local), 3)
    print(f"in-process full verify {min(local):.2f}s", flush=True)
    spark = session("local[2]")
    timed_spark_verify(spark, dsn, root, sink.table, 2)  # warm-up: JIT, Python workers
    runs = {}
    for parts in PARTITIONS:
        runs[str(parts)] = round(timed_spark_verify(spark, dsn, root, sink.table, parts), 3)
        print(f"spark local[2], {parts} partitions: {runs[str(parts)]}s", flush=True)
    out["local2_by_partitions_s"] = runs
    # The expected side read by delta-spark (the default) and by the file lists
    # of the version: alternated, so that both meet the same machine.
    readers: dict[str, list[float]] = {reader: [] for reader in READERS}
    for _ in range(READER_ROUNDS):
        for reader in READERS:
            readers[reader].append(timed_spark_verify(spark, dsn, root, sink.table, 8, reader))
    out["store_reader_s"] = {reader: round(min(s), 3) for reader, s in readers.items()}
    out["load_average_1m"] = round(os.getloadavg()[0], 2)  # what else ran beside it
    print(f"spark local[2], 8 partitions, by store reader: {out['store_reader_s']}", flush=True)
    spark.stop()
    cluster = {}
    for workers in WORKERS:
        spark = session(f"local-cluster[{workers},1,2048]")
        timed_spark_verify(spark, dsn, root, sink.table, 2 * workers)  # warm-up
        cluster[str(workers)] = round(
            timed_spark_verify(spark, dsn, root, sink.table, 2 * workers), 3
        )
        print(f"spark local-cluster, {workers} workers: {cluster[str(workers)]}s", flush=True)
        spark.stop()
    out["local_cluster_by_workers_s"] = cluster
    best = min(runs.values())
    out["spark_best_local2_s"] = best
    out["spark_vs_in_process_ratio"] = round(out["in_process_s"] / best, 3)


def make_inbox(folder: Path, batches: int, rows: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from benchmarks.recovery.bench import rows as make_rows

    folder.mkdir(parents=True)
    start = time.time() - 10 * batches
    for b in range(batches):
        ids = np.arange(b * rows, (b + 1) * rows, dtype=np.int64)
        path = folder / f"batch-{b:05d}.parquet"
        pq.write_table(make_rows(ids, seed=b).cast(SCHEMA), path)
        os.utime(path, (start + b, start + b))
    del pa


def stream_once(
    spark: Any, dsn: str, work: Path, table: str, mode: str, trigger: dict[str, Any] | None
) -> dict[str, Any]:
    """One streaming run over the inbox; Spark's own per-batch durations."""
    from reconcile.spark.stream import write_stream
    from sinks.postgres.factory import postgres_sink

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            f"CREATE TABLE {table} (id bigint PRIMARY KEY, name text, qty int4, "  # type: ignore[arg-type]
            "price float8, at timestamptz, _epoch bigint)"
        )
    frame = (
        spark.readStream.schema(spark.read.parquet(str(work / "inbox")).schema)
        .option("maxFilesPerTrigger", 1)
        .parquet(str(work / "inbox"))
    )
    checkpoint = work / f"checkpoint-{table}"
    if mode.startswith("exactly_once"):
        # exactly_once: rows from the executors (staging table + store parts);
        # exactly_once_via_driver: the staged files read by the driver.
        via = "driver" if mode.endswith("via_driver") else "executors"
        store = str(work / f"store-{table}")

        def build() -> CommitCycle:
            expected = ExpectedState(store, "bench", {table: ["id"]})
            return CommitCycle("bench", [postgres_sink(dsn, table, name=table)],
                               expected_state=expected)  # fmt: skip

        query = write_stream(
            frame, build, checkpoint=checkpoint, staging=work / f"staging-{table}", trigger=trigger,
            via=via,
        )  # fmt: skip
    else:
        # At-least-once: each micro-batch COPYs straight into the table (no
        # marker, no store, no staging); a replayed batch would be written again.
        # Its rows are collected to the driver (toArrow) and sent as CSV: the
        # usual hand-written foreachBatch, and the fastest simple COPY here.
        def copy_batch(batch: Any, batch_id: int) -> None:
            import io

            import pyarrow.csv as pacsv

            from sinks.postgres.apply import write_csv

            data = batch.toArrow()
            buffer = io.BytesIO()
            write_csv(data, buffer, pacsv.WriteOptions(include_header=False))
            names = ", ".join(data.column_names)
            statement = f"COPY {table} ({names}) FROM STDIN (FORMAT csv)"
            with (
                psycopg.connect(dsn, autocommit=True) as conn,
                conn.cursor() as cur,
                cur.copy(statement) as copy,  # type: ignore[arg-type]
            ):
                copy.write(buffer.getvalue())

        stream = frame.writeStream.foreachBatch(copy_batch).option(
            "checkpointLocation", str(checkpoint)
        )
        if trigger:
            stream = stream.trigger(**trigger)
        query = stream.start()
    began = time.perf_counter()
    query.processAllAvailable()
    elapsed = time.perf_counter() - began
    progress = [p for p in query.recentProgress if p["numInputRows"] > 0]
    query.stop()
    writer = getattr(query, "reconcile_writer", None)
    if writer is not None:
        writer.close()
    with psycopg.connect(dsn) as conn:
        held = conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]  # type: ignore[arg-type, index]
    add = [p["durationMs"]["addBatch"] for p in progress]
    whole = [p["durationMs"]["triggerExecution"] for p in progress]
    rows = sum(p["numInputRows"] for p in progress)
    return {
        "batches": len(progress),
        "rows": rows,
        "rows_in_table": held,
        "seconds": round(elapsed, 3),
        "rows_per_s": round(rows / elapsed),
        "add_batch_ms_p50": statistics.median(add),
        "add_batch_ms_p95": float(np.percentile(add, 95)),
        "batch_ms_p50": statistics.median(whole),
        "batch_ms_p95": float(np.percentile(whole, 95)),
    }


def streaming_part(args: argparse.Namespace, dsn: str, out: dict[str, Any]) -> None:
    work = Path(tempfile.mkdtemp(prefix="reconcile-bench-stream-"))
    make_inbox(work / "inbox", args.batches, args.batch_rows)
    spark = session("local[2]")
    runs = []
    try:
        n = 0
        triggers = (
            ("as_fast_as_possible", None),
            ("processing_time_1s", {"processingTime": "1 second"}),
        )
        for trigger_name, trigger in triggers:
            for mode in ("at_least_once", "exactly_once", "exactly_once_via_driver"):
                n += 1
                result = stream_once(spark, dsn, work, f"stream_{n}", mode, trigger)
                result.update(mode=mode, trigger=trigger_name)
                assert result["rows_in_table"] == args.batches * args.batch_rows, result
                runs.append(result)
                print(json.dumps(result), flush=True)
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    out["streaming"] = runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=10_000_000, help="rows of the verified table")
    parser.add_argument("--batches", type=int, default=20, help="micro-batches streamed")
    parser.add_argument("--batch-rows", type=int, default=10_000, help="rows per micro-batch")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument(
        "--streaming-only",
        action="store_true",
        help="run the streaming part only, keeping the verify figures of the last report",
    )
    parser.add_argument(
        "--verify-only",
        action="store_true",
        help="run the verify part only, keeping the streaming figures of the last report",
    )
    parser.add_argument("--plot-only", action="store_true",
                        help="run nothing: redraw spark_verify.png from --out's JSON")  # fmt: skip
    args = parser.parse_args(argv)
    if args.plot_only:
        plot(json.loads((args.out / "spark_verify.json").read_text()), args.out)
        return 0
    server = EmbeddedPostgres(fsync="on", full_page_writes="on", shared_buffers="1GB",
                      max_wal_size="8GB", work_mem="256MB")  # fmt: skip
    root = tempfile.mkdtemp(prefix="reconcile-bench-store-")
    result: dict[str, Any] = {
        "machine": machine(python=platform.python_version()),
        "versions": versions("pyspark", "pyarrow", "deltalake", "psycopg"),
        "when": now(),
        "rows": args.rows,
        "batches": args.batches,
        "batch_rows": args.batch_rows,
    }
    try:
        dsn = server.dsn(server.create_database("bench"))
        with psycopg.connect(dsn) as conn:
            result["postgres"] = str(conn.execute("SHOW server_version").fetchone()[0])  # type: ignore[index]
        if args.streaming_only:
            last = json.loads((args.out / "spark_verify.json").read_text())
            result |= {k: v for k, v in last.items() if k not in result and k != "streaming"}
        else:
            verify_part(args, dsn, root, result)
        if args.verify_only:
            last = json.loads((args.out / "spark_verify.json").read_text())
            result |= {k: last[k] for k in ("streaming", "batches", "batch_rows") if k in last}
            result["streaming_when"] = last.get("streaming_when", last["when"])
        else:
            streaming_part(args, dsn, result)
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)
    write_report("spark_verify", result, markdown(result), args.out)
    plot(result, args.out)
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
