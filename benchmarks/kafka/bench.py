"""Benchmark: Kafka -> Spark -> PostgreSQL exactly once against at least once, and the Kafka sink.

``python -m benchmarks.kafka [--quick] [--one-driver] [--trigger 1] [--rate 100]
[--seconds 30] [--saturation-rows 40000] [--batch 8000] [--epochs 11] [--epoch-rows 5000]``

Everything runs in one process's run, side by side, on one throwaway KRaft
broker (``reconcile.testing.kafka_broker``) and one throwaway PostgreSQL server
(fsync on, ``track_commit_timestamp`` on). Two parts:

(a) Kafka -> Spark -> PostgreSQL. One Spark driver process per run
(``benchmarks.kafka.pipeline``; all four runs in one driver with
``--one-driver``, the default of ``--quick``, where JVM starts would be most of
the time), each run with its own database and Spark checkpoint, in two write
modes: ``exactly_once`` (this engine's streaming writer into the
PostgreSQL sink, with its expected state) and ``at_least_once`` (a plain
``foreachBatch`` COPY and COMMIT).

- Latency, at the same processing-time trigger (``--trigger`` seconds): one
  warm-up record, left out of the figures, then ``--rate`` records a second
  for ``--seconds``, produced at evenly spaced times. A record's latency is its
  Kafka timestamp (CreateTime, set when it is produced) to the commit
  timestamp of the PostgreSQL transaction that made its row visible
  (``pg_xact_commit_timestamp(xmin)``): event to visible.
- Rows/s at saturation: ``--saturation-rows`` records already in a topic, read
  with ``availableNow`` at ``--batch`` offsets per micro-batch. Rows/s is the
  rows committed after the first micro-batch over the time from the first
  batch's commit to the last's (commit timestamps again): the first batch,
  which carries the JVM's warm-up, is left out.

(b) The Kafka sink's own cost: ``--epochs`` epochs of ``--epoch-rows`` keyed
records into a topic, through the Kafka sink (stage, prepare, commit: one
Kafka transaction per epoch, with its marker record) against a plain
idempotent confluent-kafka producer (``enable.idempotence``, produce then
flush per epoch), both encoding the records the same way; the first epoch is
each way's warm-up.

Targets (a): exactly-once rows/s at least 0.9x at-least-once's, and p99 at
most 1.1x at-least-once's; the report states each ratio as measured.

Writes ``kafka.json``, ``kafka.md`` and ``kafka_latency_throughput.png`` into ``--out``
(``--report-only`` rewrites the last two from the JSON's measured figures).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

from benchmarks.kafka.pipeline import MODES, TABLE_SQL
from benchmarks.kafka.report import judge, markdown, plot, quantiles
from benchmarks.kafka.sink import create_topic, measure_sink
from benchmarks.report import RESULTS, machine, now, versions, write_report
from reconcile.demo.embedded_pg import EmbeddedPostgres
from reconcile.testing.kafka_broker import KafkaBroker

__all__ = ["main"]

ROOT = Path(__file__).resolve().parents[2]
_DRIVER_TIMEOUT_S = 900.0


def record(i: int) -> bytes:
    """Record ``i``'s JSON value."""
    return b'{"id": %d, "customer": %d, "amount": %d.%02d}' % (i, i % 100, i % 1000, i % 97)


def visible(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT count(*) FROM events").fetchone()
    return int(row[0]) if row else 0


class Bench:
    """The broker, the server and the folders of one run."""

    def __init__(self, args: argparse.Namespace, base: Path) -> None:
        self.args, self.base = args, base
        self.server = EmbeddedPostgres(track_commit_timestamp="on", fsync="on")
        self.broker = KafkaBroker()
        self.runs = 0

    def close(self) -> None:
        self.broker.stop()
        self.server.stop()

    def prepare(self, mode: str, topic: str, rows: int, trigger: float) -> dict[str, Any]:
        """A run of ``mode`` on ``topic``: its fresh database, table and folder."""
        self.runs += 1
        workdir = self.base / f"run-{self.runs:02d}-{mode}-{'paced' if trigger else 'backlog'}"
        workdir.mkdir()
        dsn = self.server.dsn(self.server.create_database("kafka"))
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(TABLE_SQL.encode())
        return {"mode": mode, "bootstrap": self.broker.bootstrap, "topic": topic,
                "workdir": str(workdir), "dsn": dsn, "rows": rows, "trigger": trigger,
                "max_offsets": self.args.batch}  # fmt: skip

    def launch(self, plan: list[dict[str, Any]]) -> subprocess.Popen[bytes]:
        """One Spark driver process for the runs of ``plan``, one after another."""
        path = [str(ROOT), os.environ.get("PYTHONPATH", "")]
        env = {**os.environ, "BENCH_PLAN": json.dumps(plan), "PYSPARK_PYTHON": sys.executable,
               "PYTHONPATH": os.pathsep.join(filter(None, path))}  # fmt: skip
        log = (Path(plan[0]["workdir"]) / "driver.log").open("w")
        command = [sys.executable, "-m", "benchmarks.kafka.pipeline"]
        return subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=log)

    def finish(self, process: subprocess.Popen[bytes], plan: list[dict[str, Any]]) -> None:
        try:
            status = process.wait(timeout=_DRIVER_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            status = process.wait()
        if status != 0:
            tail = (Path(plan[0]["workdir"]) / "driver.log").read_text()[-3000:]
            raise RuntimeError(f"the driver of {len(plan)} runs exited with {status}:\n{tail}")

    def wait_visible(
        self, run: dict[str, Any], rows: int, process: subprocess.Popen[bytes]
    ) -> None:
        deadline = time.monotonic() + _DRIVER_TIMEOUT_S
        while visible(run["dsn"]) < rows:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{run['mode']}: {rows} rows never became visible")
            time.sleep(0.2)

    def latency(self, run: dict[str, Any], process: subprocess.Popen[bytes]) -> dict[str, Any]:
        """Paced records at the trigger: each one's Kafka timestamp to its row's commit."""
        from confluent_kafka import Producer

        args, mode, topic, dsn = self.args, run["mode"], run["topic"], run["dsn"]
        count = run["rows"] - 1
        producer = Producer({"bootstrap.servers": self.broker.bootstrap, "linger.ms": 0})
        producer.produce(topic, key=b"0", value=record(0))  # the warm-up record
        producer.flush(30)
        self.wait_visible(run, 1, process)
        print(f"{mode} latency: warm, {count} records at {args.rate}/s ...", flush=True)
        began = time.monotonic()
        for i in range(1, count + 1):
            pause = began + (i - 1) / args.rate - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            producer.produce(topic, key=str(i).encode(), value=record(i))
            producer.poll(0)
        if producer.flush(60):
            raise RuntimeError(f"{mode}: records left unsent")
        self.wait_visible(run, count + 1, process)
        with psycopg.connect(dsn) as conn:
            found = conn.execute(
                "SELECT extract(epoch FROM pg_xact_commit_timestamp(xmin) - produced) * 1000, "
                "xmin::text FROM events WHERE id > 0"
            ).fetchall()
        if len(found) != count:
            raise RuntimeError(f"{mode}: {len(found)} rows of {count}")
        samples = sorted(float(ms) for ms, _ in found)
        return {
            "records": count,
            "rate_per_s": args.rate,
            "trigger_s": run["trigger"],
            "commits": len({x for _, x in found}),
            **quantiles(samples),
        }

    def saturation(self, run: dict[str, Any], process: subprocess.Popen[bytes]) -> dict[str, Any]:
        """Rows/s through a backlog, from the first micro-batch's commit to the last's."""
        rows, mode = run["rows"], run["mode"]
        print(f"{mode} saturation: {rows} records, {self.args.batch} a batch ...", flush=True)
        self.wait_visible(run, rows, process)
        with psycopg.connect(run["dsn"]) as conn:
            commits = conn.execute(
                "SELECT extract(epoch FROM pg_xact_commit_timestamp(xmin)), count(*) FROM events "
                "GROUP BY 1 ORDER BY 1"
            ).fetchall()
        total = sum(int(n) for _, n in commits)
        if total != rows or len(commits) < 3:
            raise RuntimeError(f"{mode}: {total} rows of {rows} in {len(commits)} commits")
        span = float(commits[-1][0]) - float(commits[0][0])
        after_first = total - int(commits[0][1])
        gaps = [float(b[0]) - float(a[0]) for a, b in itertools.pairwise(commits)]
        return {
            "rows": rows,
            "batch_offsets": self.args.batch,
            "commits": len(commits),
            "rows_per_s": round(after_first / span),
            "mean_batch_s": round(sum(gaps) / len(gaps), 3),
        }

    def fill(self, rows: int) -> str:
        """A topic holding ``rows`` records, read by each mode's saturation run."""
        from confluent_kafka import Producer

        topic = create_topic(self.broker, "backlog")
        producer = Producer({"bootstrap.servers": self.broker.bootstrap, "linger.ms": 20})
        for i in range(rows):
            while True:
                try:
                    producer.produce(topic, key=str(i).encode(), value=record(i))
                    break
                except BufferError:  # the local queue is full: let it drain
                    producer.poll(0.1)
            producer.poll(0)
        if producer.flush(120):
            raise RuntimeError("backlog records left unsent")
        return topic


def run_all(args: argparse.Namespace) -> dict[str, Any]:
    base = Path(tempfile.mkdtemp(prefix="reconcile-bench-kafka-"))
    load_start = [round(x, 2) for x in os.getloadavg()]
    began = time.monotonic()
    bench = Bench(args, base)
    try:
        backlog = bench.fill(args.saturation_rows)
        count = int(args.rate * args.seconds) + 1  # with the warm-up record
        # Latency in MODES' order, saturation in the reverse one: neither mode always
        # runs first (on a colder JVM or a quieter machine).
        plan = [bench.prepare(m, create_topic(bench.broker, f"paced-{m}"), count, args.trigger)
                for m in MODES]  # fmt: skip
        plan += [bench.prepare(m, backlog, args.saturation_rows, 0) for m in reversed(MODES)]
        latency: dict[str, Any] = {}
        saturation: dict[str, Any] = {}

        def measure(run: dict[str, Any], process: subprocess.Popen[bytes]) -> None:
            if run["trigger"]:
                latency[run["mode"]] = bench.latency(run, process)
            else:
                saturation[run["mode"]] = bench.saturation(run, process)

        if args.one_driver:
            process = bench.launch(plan)
            for run in plan:
                measure(run, process)
            bench.finish(process, plan)
        else:
            for run in plan:
                process = bench.launch([run])
                measure(run, process)
                bench.finish(process, [run])
        sink = measure_sink(bench.broker, args.epochs, args.epoch_rows)
    finally:
        bench.close()
        shutil.rmtree(base, ignore_errors=True)
    report: dict[str, Any] = {
        "benchmark": "kafka",
        "quick": args.quick,
        "when": now(),
        "machine": machine(
            load_average_at_start=load_start,
            load_average_at_end=[round(x, 2) for x in os.getloadavg()],
            shared="2 cores shared with other concurrent work (see the load averages)",
        ),
        "versions": versions("pyspark", "pyarrow", "psycopg", "confluent-kafka"),
        "spark_drivers": "one for all runs" if args.one_driver else "one per run",
        "took_s": round(time.monotonic() - began, 1),
        "latency": latency,
        "saturation": saturation,
        "sink": sink,
    }
    report["targets"] = judge(report)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.kafka",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke test")
    parser.add_argument("--trigger", type=float, default=1.0, help="processing-time trigger, s")
    parser.add_argument("--rate", type=float, default=None, help="records/s in the latency runs")
    parser.add_argument("--seconds", type=float, default=None, help="length of a latency run")
    parser.add_argument("--saturation-rows", type=int, default=None)
    parser.add_argument("--batch", type=int, default=None, help="maxOffsetsPerTrigger")
    parser.add_argument("--epochs", type=int, default=None, help="sink part: epochs")
    parser.add_argument("--epoch-rows", type=int, default=None, help="sink part: rows an epoch")
    parser.add_argument("--one-driver", action="store_true",
                        help="all runs in one Spark driver (the default with --quick)")  # fmt: skip
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--report-only", action="store_true",
                        help="rewrite kafka.md and the plot from --out's kafka.json")  # fmt: skip
    args = parser.parse_args(argv)
    if args.report_only:
        report = json.loads((args.out / "kafka.json").read_text())
        report["targets"] = judge(report)
        write_report("kafka", report, markdown(report), args.out)
        plot(report, args.out / "kafka_latency_throughput.png")
        return 0
    defaults = (
        {"rate": 40, "seconds": 3, "saturation_rows": 3_000, "batch": 1_000, "epochs": 3,
         "epoch_rows": 500}
        if args.quick
        else {"rate": 100, "seconds": 30, "saturation_rows": 40_000, "batch": 8_000,
              "epochs": 11, "epoch_rows": 5_000}
    )  # fmt: skip
    args.one_driver = args.one_driver or args.quick
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.epochs < 2 or args.saturation_rows < 3 * args.batch:
        # Epoch 0 and the first micro-batch are warm-up, left out of the figures.
        parser.error("--epochs must be at least 2, --saturation-rows at least 3 x --batch")
    report = run_all(args)
    write_report("kafka", report, markdown(report), args.out)
    plot(report, args.out / "kafka_latency_throughput.png")
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
