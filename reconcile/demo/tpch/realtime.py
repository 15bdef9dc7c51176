"""``reconcile demo --realtime``: lineitem through Kafka into PostgreSQL under Real-Time Mode.

The supervisor starts a broker and PostgreSQL (``--pg`` or an embedded
server), produces the TPC-H lineitem slices into a topic one per
``--interval``, and runs the pipeline process
(``reconcile.demo.tpch.realtime_pipeline``): Spark's Real-Time Mode, long
batches whose tasks commit small transactions with offset markers. With
``--chaos SEED`` it SIGKILLs the pipeline's whole process group ``--crashes``
times, each a seeded moment after rows of that launch became visible (so
inside a long batch, whose offsets Spark has not checkpointed), and starts it
again on the same checkpoint: Spark replays the batch, and the markers skip
what is in the table already.

The audit reads PostgreSQL, not the pipeline's word: every generated line
once (none missing, none twice, every value as generated), and each slice's
latency from its production to the commit of its last row. Only the line
items go this way: the demo's other sink, revenue per customer, is an
aggregation, which Real-Time Mode's writer refuses (a replayed record's
output would depend on what else the replay read).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from reconcile.core.contract import ConfigurationError
from reconcile.demo.tpch.data import LINEITEM_COLUMNS, Feed, generate
from reconcile.demo.tpch.kafka_source import feed_source
from reconcile.demo.tpch.realtime_pipeline import COLUMNS, PIPELINE, SINK, TABLE
from reconcile.demo.tpch.supervisor import Feeder, Options, _postgres

__all__ = ["RealtimeSummary", "run_realtime"]

DEADLINE_S = 900.0  # from the first launch to the last record: a bound, not a target
MAX_FAILURES = 3  # exits nobody caused, in a row, before the demo gives up
MARKERS = "reconcile.reconcile_realtime_offsets"  # the writer's offset markers (a fixed name)


@dataclass
class RealtimeSummary:
    """What the realtime demo found, read from PostgreSQL."""

    scale: float
    slices: int
    expected: int  # lines generated
    rows: int  # rows in the table
    missing: int
    duplicates: int  # rows beyond the first of a key
    wrong: int  # keys whose row differs from the generated line
    kills: int  # SIGKILLs that hit a running pipeline
    launches: int
    seconds: float
    latency_ms: dict[str, float | None] = field(default_factory=dict)  # per slice: p50, max

    @property
    def verified(self) -> bool:
        return self.rows == self.expected and not (self.missing or self.duplicates or self.wrong)

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "verified": self.verified})

    def render(self) -> str:
        late = self.latency_ms
        return (
            f"demo --realtime: TPC-H scale {self.scale}, {self.slices} slices, "
            f"{self.expected} lines through Kafka into {TABLE} in {self.seconds:.1f}s\n"
            f"chaos: {self.kills} kills of the pipeline mid-batch, {self.launches} launches\n"
            f"audit (SQL): {self.rows} rows, {self.missing} missing, {self.duplicates} twice, "
            f"{self.wrong} wrong: {'OK, every line exactly once' if self.verified else 'FAILED'}\n"
            f"slice produced -> last row committed: p50 {late.get('p50')} ms, "
            f"max {late.get('max')} ms"
        )


def run_realtime(options: Options) -> RealtimeSummary:
    """Run the realtime demo in a fresh work folder; its audit.

    Raises:
        ConfigurationError: a work folder of an earlier run, or a database holding
            an earlier realtime demo's rows or markers (``--reset`` drops them).
        RuntimeError: the pipeline exited on its own ``MAX_FAILURES`` times in a row
            (its log's tail in the message), or missed the deadline.
    """
    import tempfile

    workdir = Path(options.workdir or tempfile.mkdtemp(prefix="reconcile-demo-rt-")).resolve()
    if (workdir / "tpch").exists() and (workdir / "checkpoint-realtime").exists():
        raise ConfigurationError(
            f"--realtime cannot resume the run in {workdir}: its broker and topic lived only "
            "as long as that run. Use a new --workdir"
        )
    workdir.mkdir(parents=True, exist_ok=True)
    tables = generate(workdir / "tpch", options.scale)
    began = time.monotonic()
    with (
        feed_source("kafka", tables, workdir, options.epochs, False) as (feed, env),
        _postgres(options, workdir) as dsn,
    ):
        _prepare(dsn, options.reset)
        launches, kills = _drive(workdir, options, dsn, feed, env)
        return _audit(dsn, feed, options, launches, kills, time.monotonic() - began)


def _prepare(dsn: str, reset: bool) -> None:
    """The demo's table, empty, and no markers of an earlier run (whose offsets would skip ours)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        table = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (TABLE,)).fetchone()
        rows = bool(table and table[0]) and bool(
            conn.execute(
                sql.SQL("SELECT EXISTS (SELECT FROM {})").format(sql.Identifier(TABLE))
            ).fetchone()[0]  # type: ignore[index]
        )
        covered = _covered(conn)
        if (rows or covered) and not reset:
            raise ConfigurationError(
                f"the database holds an earlier realtime demo ({TABLE} rows or {PIPELINE} "
                "offset markers): its markers would skip this run's records. Use --reset to "
                "drop them, or another database"
            )
        if covered is not None:
            conn.execute(f"DELETE FROM {MARKERS} WHERE pipeline = %s AND sink = %s",
                         (PIPELINE, SINK))  # fmt: skip
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(TABLE)))
        columns = sql.SQL(", ").join(
            sql.SQL("{} {}").format(sql.Identifier(name), sql.SQL(pg))
            for name, _, pg in LINEITEM_COLUMNS
        )
        conn.execute(sql.SQL("CREATE TABLE {} ({})").format(sql.Identifier(TABLE), columns))


def _covered(conn: psycopg.Connection[Any]) -> int | None:
    """How many records the markers say are in the table; None before the marker table exists."""
    made = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (MARKERS,)).fetchone()
    if not (made and made[0]):
        return None
    row = conn.execute(
        f"SELECT coalesce(sum(last_offset + 1), 0) FROM {MARKERS} "
        "WHERE pipeline = %s AND sink = %s",
        (PIPELINE, SINK),
    ).fetchone()
    return int(row[0]) if row else 0


def _launch(workdir: Path, options: Options, dsn: str, env: dict[str, str], n: int) -> Any:
    (workdir / "logs").mkdir(exist_ok=True)
    with (workdir / "logs" / f"realtime-{n}.log").open("wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "reconcile.demo.tpch.realtime_pipeline", str(workdir),
             options.master],
            env={**os.environ, **env, "RECONCILE_DEMO_DSN": dsn, "PYSPARK_PYTHON": sys.executable},
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip


def _drive(
    workdir: Path, options: Options, dsn: str, feed: Feed, env: dict[str, str]
) -> tuple[int, int]:
    """Feed, run and (with chaos) kill the pipeline until the markers cover every line."""
    total = sum(part.rows for part in feed.slices)
    rng = random.Random(options.chaos)
    crashes = options.crashes if options.chaos is not None else 0
    started = threading.Event()
    feeder = Feeder(feed, options.interval, started)
    feeder.start()
    launches, kills, failures = 1, 0, 0
    proc = _launch(workdir, options, dsn, env, launches)
    started.set()
    deadline = time.monotonic() + DEADLINE_S
    # One connection for the loop's looks, five a second: not a connect each.
    look = psycopg.connect(dsn, autocommit=True)
    at_launch, kill_at = _covered(look) or 0, None
    try:
        while (done := _covered(look) or 0) < total:
            if time.monotonic() > deadline:
                raise RuntimeError(f"demo --realtime: {done} of {total} lines in after "
                                   f"{DEADLINE_S:.0f}s; see {workdir / 'logs'}")  # fmt: skip
            if proc.poll() is not None:
                failures += 1
                if failures >= MAX_FAILURES:
                    tail = (workdir / "logs" / f"realtime-{launches}.log").read_text()[-3000:]
                    raise RuntimeError(f"the realtime pipeline exited {proc.returncode} "
                                       f"{failures} times in a row: {tail}")  # fmt: skip
                launches += 1
                proc, at_launch, kill_at = _launch(workdir, options, dsn, env, launches), done, None
            elif kills < crashes and done > at_launch:
                # WHY after this launch's rows show: the kill then lands inside a long batch
                # that has committed transactions, whose offsets Spark has not checkpointed.
                kill_at = kill_at or time.monotonic() + rng.uniform(0.0, 1.5)
                if time.monotonic() >= kill_at:
                    os.killpg(proc.pid, signal.SIGKILL)
                    if proc.wait(timeout=60) == -signal.SIGKILL:
                        kills += 1  # it was running: the fault fired
                    failures = 0
                    launches += 1
                    proc = _launch(workdir, options, dsn, env, launches)
                    at_launch, kill_at = _covered(look) or 0, None
            time.sleep(0.2)
    finally:
        look.close()
        feeder.stop.set()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    return launches, kills


def _audit(
    dsn: str, feed: Feed, options: Options, launches: int, kills: int, seconds: float
) -> RealtimeSummary:
    """Every generated line once and as generated, read back from PostgreSQL."""
    names = sql.SQL(", ").join(sql.Identifier(c) for c in COLUMNS)
    with psycopg.connect(dsn, autocommit=True) as conn:
        found = conn.execute(sql.SQL("SELECT {} FROM {}").format(names, sql.Identifier(TABLE)))
        rows = [tuple(r) for r in found.fetchall()]
        late = _latencies(conn, feed)
    expected = {(r["l_orderkey"], r["l_linenumber"]): tuple(r[c] for c in COLUMNS)
                for r in feed.lineitem.to_pylist()}  # fmt: skip
    seen: dict[tuple[Any, Any], tuple[Any, ...]] = {}
    duplicates = wrong = 0
    for row in rows:
        key = (row[0], row[3])  # l_orderkey, l_linenumber
        if key in seen:
            duplicates += 1
        seen[key] = row
        wrong += expected.get(key, row) != row
    missing = len(expected.keys() - seen.keys())
    return RealtimeSummary(
        options.scale, len(feed.slices), len(expected), len(rows), missing, duplicates, wrong,
        kills, launches, round(seconds, 1), late,
    )  # fmt: skip


def _latencies(conn: psycopg.Connection[Any], feed: Feed) -> dict[str, float | None]:
    """Per slice, its production (the fed file's time) to its last row's commit; p50 and max."""
    try:
        per_slice = []
        for part in feed.slices:
            row = conn.execute(
                sql.SQL("SELECT extract(epoch FROM max(pg_xact_commit_timestamp(xmin))) FROM {} "
                        "WHERE l_orderkey >= %s AND l_orderkey < %s").format(sql.Identifier(TABLE)),
                (part.lo, part.hi),
            ).fetchone()  # fmt: skip
            if row and row[0] is not None:
                per_slice.append((float(row[0]) - feed.path(part.index).stat().st_mtime) * 1000)
    except psycopg.errors.ObjectNotInPrerequisiteState:  # track_commit_timestamp is off
        return {"p50": None, "max": None}
    per_slice.sort()
    if not per_slice:
        return {"p50": None, "max": None}
    return {"p50": round(per_slice[len(per_slice) // 2], 1), "max": round(per_slice[-1], 1)}
