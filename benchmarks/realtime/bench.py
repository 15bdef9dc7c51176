"""The Real-Time Mode benchmark's run: one broker, one server, each mode in turn.

Each mode gets a fresh database on the one PostgreSQL server (fsync on,
``track_commit_timestamp`` on), a fresh topic of 2 partitions on the one KRaft broker, and
its own Spark driver process (``benchmarks.realtime.driver``, ``local[2]``). Per mode:

1. one record per partition, and a wait until both are visible (the query runs; for
   two-phase, a checkpoint has passed);
2. records paced at ``--rate`` a second (:func:`produce`) for ``--warmup`` seconds (left
   out of the figures), then for ``--duration`` seconds (measured), each stamped with its
   Kafka CreateTime and numbered (``id``) in its JSON value, alternately to each partition;
3. a wait until every record is visible, then the driver is told to stop;
4. SQL over the table: each measured record's latency (its CreateTime to the commit
   timestamp of the transaction that made its row visible, the first one if it was
   written twice), the rows/s delivered, duplicates and missing records.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import psycopg

from benchmarks.kafka.bench import record
from benchmarks.kafka.pipeline import TABLE_SQL
from benchmarks.kafka.report import quantiles
from benchmarks.realtime.driver import RTM_TABLE_SQL
from reconcile.demo.embedded_pg import EmbeddedPostgres
from reconcile.testing.kafka_broker import KafkaBroker

__all__ = ["Bench", "produce"]

ROOT = Path(__file__).resolve().parents[2]
PARTITIONS = 2
_START_TIMEOUT_S = 300.0  # a Spark driver's start and first batch on 2 busy cores
# After the last record, for the rest to become visible: this, plus the time the records
# took to produce (a mode delivering half the rate still drains), plus a checkpoint interval.
_DRAIN_TIMEOUT_S = 120.0
_STOP_TIMEOUT_S = 120.0


def produce(producer: Any, topic: str, first: int, count: int, rate: float) -> dict[str, Any]:
    """Produce records ``first`` .. ``first + count - 1`` at ``rate`` a second.

    Paced by the clock: every millisecond or so, the records due by then are produced
    (a record a time would need sleeps shorter than the scheduler grants). Returns the
    achieved rate and how far the producer fell behind its schedule at worst.
    """
    began = time.monotonic()
    sent, behind = 0, 0.0
    while sent < count:
        now = time.monotonic()
        due = min(count, int((now - began) * rate) + 1)
        behind = max(behind, (now - began) - sent / rate)
        while sent < due:
            i = first + sent
            try:
                producer.produce(
                    topic, key=str(i).encode(), value=record(i), partition=i % PARTITIONS
                )
            except BufferError:  # the local queue is full: let it drain
                producer.poll(0.01)
                continue
            sent += 1
        producer.poll(0)
        time.sleep(0.001)
    took = time.monotonic() - began
    return {
        "records": count,
        "seconds": round(took, 3),
        # ``count`` records span ``count - 1`` intervals of 1 / rate.
        "achieved_rate_per_s": round((count - 1) / took) if took > 0 else None,
        "max_behind_s": round(behind, 3),
    }


class Bench:
    """The broker, the server, the writer's JAR and the folders of one run."""

    def __init__(self, args: argparse.Namespace, base: Path, jar: Path) -> None:
        self.args, self.base, self.jar = args, base, jar
        # Two-phase commit holds every micro-batch of a checkpoint interval prepared.
        prepared = max(100, int(4 * args.checkpoint / max(args.trigger, 0.05)))
        self.server = EmbeddedPostgres(
            track_commit_timestamp="on", fsync="on", max_prepared_transactions=prepared
        )
        self.broker = KafkaBroker()

    def close(self) -> None:
        self.broker.stop()
        self.server.stop()

    def count(self, dsn: str, rows: int) -> int:
        """The distinct records visible, counted only once there are ``rows`` rows."""
        with psycopg.connect(dsn) as conn:
            # count(*) first: a DISTINCT count of every poll would take the CPU from the
            # modes' rows still in flight.
            row = conn.execute("SELECT count(*) FROM events").fetchone()
            if row and row[0] >= rows:
                row = conn.execute("SELECT count(DISTINCT id) FROM events").fetchone()
        return int(row[0]) if row else 0

    def wait_for(
        self, dsn: str, rows: int, driver: subprocess.Popen[bytes], timeout: float
    ) -> bool:
        deadline = time.monotonic() + timeout
        while self.count(dsn, rows) < rows:
            if driver.poll() is not None or time.monotonic() > deadline:
                return False
            time.sleep(0.5)
        return True

    def run_mode(self, spec: dict[str, Any]) -> dict[str, Any]:
        """One mode end to end: its figures, or its error."""
        from confluent_kafka import Producer

        from tests.fix_kafka import create_topic

        args, mode = self.args, spec["mode"]
        workdir = self.base / mode
        workdir.mkdir()
        dsn = self.server.dsn(self.server.create_database("rt"))
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute((RTM_TABLE_SQL if spec["kind"].startswith("rtm_") else TABLE_SQL).encode())
        topic = create_topic(self.broker, "rt", PARTITIONS)
        run = {
            **spec,
            "bootstrap": self.broker.bootstrap,
            "topic": topic,
            "dsn": dsn,
            "workdir": str(workdir),
            "rtm_batch": args.rtm_batch,
            "jar": str(self.jar) if spec["kind"] == "rtm_at_least_once" else None,
        }
        load_start = [round(x, 2) for x in os.getloadavg()]
        env = {
            **os.environ,
            "BENCH_PLAN": json.dumps(run),
            "PYSPARK_PYTHON": sys.executable,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        }
        log_path = workdir / "driver.log"
        with log_path.open("w") as log:
            driver = subprocess.Popen(
                [sys.executable, "-m", "benchmarks.realtime.driver"],
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=log,
            )
        producer = Producer({"bootstrap.servers": self.broker.bootstrap, "linger.ms": 0})
        warm_n = int(args.rate * args.warmup)
        count = int(args.rate * args.duration)
        total = PARTITIONS + warm_n + count
        result: dict[str, Any] = {"kind": spec["kind"], **_settings(spec, args)}
        try:
            print(f"{mode}: starting its driver ...", flush=True)
            for i in range(PARTITIONS):  # one record a partition: the query is running
                producer.produce(topic, key=str(i).encode(), value=record(i), partition=i)
            producer.flush(30)
            if not self.wait_for(dsn, PARTITIONS, driver, _START_TIMEOUT_S):
                raise RuntimeError("its first records never became visible")
            print(
                f"{mode}: running; {warm_n} warm-up records then {count} at {args.rate:g}/s ...",
                flush=True,
            )
            produce(producer, topic, PARTITIONS, warm_n, args.rate)
            result["producer"] = produce(producer, topic, PARTITIONS + warm_n, count, args.rate)
            if producer.flush(60):
                raise RuntimeError("records left unsent")
            wait = _DRAIN_TIMEOUT_S + args.warmup + args.duration + spec["checkpoint_s"]
            drained = self.wait_for(dsn, total, driver, wait)
            result["drained"] = drained
        except Exception as exc:
            result["error"] = f"{type(exc).__name__}: {exc}"
        finally:
            (workdir / "stop").touch()
            try:
                status = driver.wait(timeout=_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                driver.kill()
                status = driver.wait()
        result["load_average_start"] = load_start
        result["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
        if status != 0:
            result["driver_error"] = log_path.read_text()[-3000:]
        result.update(figures(dsn, total, PARTITIONS + warm_n, count))
        print(
            f"{mode}: {json.dumps({k: v for k, v in result.items() if k != 'cdf_quantiles_ms'})}",
            flush=True,
        )
        return result


def _settings(spec: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """What the mode ran with, for the report."""
    kind = spec["kind"]
    if kind.startswith("rtm_"):
        found: dict[str, Any] = {"rtm_batch": args.rtm_batch}
        found |= {"rows_per_txn": spec["rows_per_txn"], "ms_per_txn": spec["ms_per_txn"]}
        return found
    found = {"trigger_s": spec["trigger_s"]}
    if kind == "two_phase":
        found["checkpoint_s"] = spec["checkpoint_s"]
    return found


def figures(dsn: str, total: int, first: int, count: int) -> dict[str, Any]:
    """Latency, rows/s, duplicates and missing records of one mode's table, by SQL."""
    with psycopg.connect(dsn) as conn:
        counted = conn.execute("SELECT count(*), count(DISTINCT id) FROM events").fetchone()
        rows, distinct = (int(counted[0]), int(counted[1])) if counted else (0, 0)
        missing = conn.execute(
            "SELECT count(*) FROM generate_series(0, %s - 1) AS g(id) "
            "WHERE NOT EXISTS (SELECT 1 FROM events e WHERE e.id = g.id)",
            (total,),
        ).fetchone()
        # A record written twice counts once, at its first visibility.
        found = conn.execute(
            "SELECT min(extract(epoch FROM pg_xact_commit_timestamp(xmin) - produced)) * 1000, "
            "min(extract(epoch FROM pg_xact_commit_timestamp(xmin))), "
            "min(extract(epoch FROM produced)) FROM events "
            "WHERE id >= %s AND id < %s GROUP BY id ORDER BY id",
            (first, first + count),
        ).fetchall()
        commits = conn.execute(
            "SELECT count(DISTINCT xmin::text) FROM events WHERE id >= %s AND id < %s",
            (first, first + count),
        ).fetchone()
    out: dict[str, Any] = {
        "expected_rows": total,
        "rows": rows,
        "duplicates": rows - distinct,
        "missing": int(missing[0]) if missing else total,
        "measured_records": count,
        "measured_visible": len(found),
        "commits": int(commits[0]) if commits else 0,
    }
    if found:
        # Delivered: the measured rows over the time from the first one's production to
        # the last one's visibility (a mode that keeps up delivers about the rate).
        span = max(float(v) for _, v, _ in found) - min(float(p) for _, _, p in found)
        out["rows_per_s"] = round(len(found) / span) if span > 0 else None
        out.update(quantiles([float(ms) for ms, _, _ in found]))
        # Falling behind shows as latency growing over the run: the median of the last
        # tenth of the records (by production order) against the first tenth's.
        tenth = max(1, len(found) // 10)
        head = float(np.median([float(ms) for ms, _, _ in found[:tenth]]))
        tail = float(np.median([float(ms) for ms, _, _ in found[-tenth:]]))
        out["p50_first_tenth_ms"], out["p50_last_tenth_ms"] = round(head, 1), round(tail, 1)
    return out


def make_base() -> Path:
    return Path(tempfile.mkdtemp(prefix="reconcile-bench-realtime-"))


def remove(base: Path) -> None:
    shutil.rmtree(base, ignore_errors=True)
