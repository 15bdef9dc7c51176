"""Rebuild by diff beside truncate-and-reload and a side-table swap, on one 10M-row table.

``python -m benchmarks.rebuild [--rows N] [--changed F] [--out DIR] [--quick]``

A throwaway durable PostgreSQL (fsync and full-page writes on) and a store on
disk. Set up, not timed: the pipeline ``bench`` writes ``--rows`` rows (default
10,000,000, in ``--epochs`` epochs) into ``bench_rows (k bigint PRIMARY KEY,
v bigint, w text, _epoch bigint)`` through the engine, so that the sink and the
expected state both hold the old logic (``v = 2k``, ``w = 'r' || k``). The new
logic differs in ``v`` for a fraction ``--changed`` of the keys (default 1 %,
every 100th key). Then three ways to bring the table to the new logic, each from
the same old-logic table:

1. ``truncate_reload``: one transaction, TRUNCATE and COPY every new row;
2. ``side_table_swap``: a new table, COPY every row, build its primary key, then
   one transaction renames the old table away and the new one in, and drops the old;
3. ``rebuild``: ``reconcile.rebuild.rebuild`` (the engine diffs the two expected
   states and applies only the differing rows, in bounded fenced transactions).

For each: the wall time, the rows written (the rises of ``n_tup_ins + n_tup_upd
+ n_tup_del`` in ``pg_stat_user_tables``), and the longest gap a reader of
random keys saw (``benchmarks/rebuild/measure.py``). Reports:
``rebuild.json``, ``rebuild.md`` and ``rebuild.png`` in ``--out``.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
from psycopg import sql

from benchmarks.rebuild.measure import (
    TABLE,
    Reader,
    copy_rows,
    logic_state,
    settled_writes,
    with_epoch,
    written,
)
from benchmarks.report import RESULTS, machine, now, versions, write_report
from reconcile.rebuild import rebuild  # imported here: its import is not the rebuild's time

__all__ = ["main", "matches_new_logic", "parser"]

PIPELINE = "bench"
SINK = "rows"
METHODS = ("truncate_reload", "side_table_swap", "rebuild")
Steps = dict[str, float]


def parser() -> argparse.ArgumentParser:
    """The command's options."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.rebuild", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--rows", type=int, default=10_000_000, help="rows in the table")
    p.add_argument("--changed", type=float, default=0.01,
                   help="share of keys whose v the new logic changes")  # fmt: skip
    p.add_argument("--epochs", type=int, default=10, help="epochs the setup writes the rows in")
    p.add_argument("--part-rows", type=int, default=50_000, help="rows per rebuild transaction")
    p.add_argument("--out", type=Path, default=RESULTS, help="where the reports go")
    p.add_argument("--profile", action="store_true",
                   help="sample the rebuild with py-spy (rebuild_profile.txt)")  # fmt: skip
    p.add_argument("--quick", action="store_true",
                   help="50,000 rows in 5 epochs: a check that it runs, not figures")  # fmt: skip
    return p


def _cycle(dsn: str, root: Path) -> Any:
    from reconcile.engine.cycle import CommitCycle
    from reconcile.engine.expected import ExpectedState
    from sinks.postgres.factory import postgres_sink

    return CommitCycle(
        PIPELINE,
        [postgres_sink(dsn, TABLE, name=SINK)],
        expected_state=ExpectedState(str(root), PIPELINE, {SINK: ["k"]}),
    )


def load_through_engine(dsn: str, root: Path, old: pa.Table, epochs: int) -> None:
    """The old logic's rows into the sink and the store, epochs 1..``epochs``."""
    from reconcile.engine.cycle import CommitSucceeded

    cycle = _cycle(dsn, root)
    try:
        cycle.start()
        per = math.ceil(old.num_rows / epochs)
        for epoch in range(1, epochs + 1):
            result = cycle.run_epoch(epoch, {SINK: old.slice((epoch - 1) * per, per)})
            if not isinstance(result, CommitSucceeded):
                raise RuntimeError(f"setup: epoch {epoch} ended {result!r}")
    finally:
        cycle.close()


def reload_old(dsn: str, old: pa.Table, epochs: int) -> None:
    """The table back to the old logic's rows as the setup left them (not timed)."""
    per = math.ceil(old.num_rows / epochs)
    epoch_of = pa.array(1 + np.arange(old.num_rows, dtype=np.int64) // per)
    with psycopg.connect(dsn) as conn:
        conn.execute(sql.SQL("TRUNCATE {}").format(sql.Identifier(TABLE)))
        copy_rows(conn, TABLE, with_epoch(old, epoch_of))
        conn.commit()
        conn.execute("SELECT pg_stat_force_next_flush()")


def truncate_reload(dsn: str, new: pa.Table) -> Steps:
    """One transaction: TRUNCATE, then COPY every row of the new logic."""
    steps: Steps = {}
    began = time.perf_counter()
    with psycopg.connect(dsn) as conn:
        conn.execute(sql.SQL("TRUNCATE {}").format(sql.Identifier(TABLE)))
        steps["truncate"] = time.perf_counter() - began
        copy_rows(conn, TABLE, new)
        steps["copy"] = time.perf_counter() - began - sum(steps.values())
        conn.commit()
        steps["commit"] = time.perf_counter() - began - sum(steps.values())
        conn.execute("SELECT pg_stat_force_next_flush()")
        conn.commit()
    return steps


def side_table_swap(dsn: str, new: pa.Table) -> Steps:
    """COPY into a new table, build its key, then swap it in and drop the old in one transaction."""
    table, side, old = (sql.Identifier(n) for n in (TABLE, f"{TABLE}_new", f"{TABLE}_old"))
    steps: Steps = {}
    began = time.perf_counter()

    def done(step: str) -> None:
        steps[step] = time.perf_counter() - began - sum(steps.values())

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE TABLE {} (LIKE {} INCLUDING DEFAULTS)").format(side, table))
        done("create")
        with conn.transaction():
            copy_rows(conn, f"{TABLE}_new", new)
        done("copy")
        conn.execute(sql.SQL("ALTER TABLE {} ADD PRIMARY KEY (k)").format(side))
        done("primary_key")
        with conn.transaction():
            conn.execute(sql.SQL("ALTER TABLE {} RENAME TO {}").format(table, old))
            conn.execute(sql.SQL("ALTER TABLE {} RENAME TO {}").format(side, table))
            conn.execute(sql.SQL("DROP TABLE {}").format(old))
            conn.execute(sql.SQL("ALTER INDEX {} RENAME TO {}").format(
                sql.Identifier(f"{TABLE}_new_pkey"), sql.Identifier(f"{TABLE}_pkey")))  # fmt: skip
        done("swap")
        conn.execute("SELECT pg_stat_force_next_flush()")
    return steps


def by_diff(dsn: str, root: Path, new: pa.Table, part_rows: int) -> tuple[Steps, dict[str, Any]]:
    """``rebuild(build, recompute, logic_version="v2")``; its report's steps and plan."""
    cycles: list[Any] = []

    def build() -> Any:
        cycles.append(_cycle(dsn, root))
        return cycles[-1]

    report = rebuild(build, lambda sink: new, logic_version="v2", part_rows=part_rows)
    for cycle in cycles:  # the sink's sessions end (rebuild closes them too): each sends
        cycle.close()  # its counters to the statistics as it exits
    table = report.tables[SINK]
    plan = table.plan
    assert plan is not None, f"the rebuild reported no plan for {SINK!r}: {report!r}"
    figures = {"call": "reconcile.rebuild.rebuild", "part_rows": part_rows,
               "applied": table.applied, "parts": table.parts, "how": table.how,
               "step": report.step,
               "plan": {"inserts": plan.inserts, "updates": plan.updates,
                        "deletes": plan.deletes, "changed": plan.changed}}  # fmt: skip
    return {k: float(v) for k, v in report.seconds.items()}, figures


def matches_new_logic(dsn: str, rows: int, step: int) -> bool:
    """The server's own rows: every key there once, each with the new logic's values."""
    query = sql.SQL(
        "SELECT count(*), count(DISTINCT k), count(*) FILTER (WHERE v IS DISTINCT FROM "
        "2 * k + (k %% %s = 0)::int OR w IS DISTINCT FROM 'r' || k), min(k), max(k) FROM {}"
    ).format(sql.Identifier(TABLE))
    with psycopg.connect(dsn) as conn:
        count, distinct, wrong, low, high = conn.execute(query, (step,)).fetchone() or (0,) * 5
    return bool(count == distinct == rows and wrong == 0 and low == 0 and high == rows - 1)


@dataclass(frozen=True)
class Bench:
    """The table under test: its server and what its rows must be after each method."""

    dsn: str
    rows: int
    step: int
    server_pid: int


def measure(bench: Bench, action: Callable[[], Any], profile: Path | None = None) -> dict[str, Any]:
    """One method from a settled table: wall time, CPU, rows written, the reader's figures."""
    from benchmarks.rebuild.profile import Profile, summary
    from benchmarks.sink_harness import Cpu

    with psycopg.connect(bench.dsn, autocommit=True) as conn:
        # Every method starts from a table without dead rows and a fresh checkpoint.
        conn.execute(sql.SQL("VACUUM (ANALYZE) {}").format(sql.Identifier(TABLE)))
        conn.execute("CHECKPOINT")
    before = settled_writes(bench.dsn)
    with Reader(bench.dsn, bench.rows) as reader, contextlib.ExitStack() as stack:
        if profile is not None:
            stack.enter_context(Profile(profile))
        stop = Cpu((bench.server_pid,)).start()
        outcome = action()
        cpu = stop()
    steps, extra = outcome if isinstance(outcome, tuple) else (outcome, {})
    tables = written(before, settled_writes(bench.dsn))
    return {
        "seconds": round(cpu["seconds"], 3),
        "client_cpu_s": round(cpu["client_cpu_s"], 2),
        "server_cpu_s": round(cpu["server_cpu_s"], 2),
        "steps_s": {k: round(v, 3) for k, v in steps.items()},
        "rows_written": sum(sum(t.values()) for t in tables.values()),
        "rows_written_by_table": tables,
        "reader": reader.figures,
        "sink_matches_new_logic": matches_new_logic(bench.dsn, bench.rows, bench.step),
        **({"profile": summary(profile)} if profile is not None else {}),
        **extra,
    }


def run(rows: int, changed: float, epochs: int, part_rows: int,
        profile: Path | None = None) -> dict[str, Any]:  # fmt: skip
    """Every method on one server; the report's figures."""
    from reconcile.demo.embedded_pg import EmbeddedPostgres

    step = max(1, round(1 / changed))
    old, new = logic_state(rows, None), logic_state(rows, step)
    changed_rows = math.ceil(rows / step)
    new_rows = with_epoch(new, epochs + 1)
    methods: dict[str, Any] = {}
    with EmbeddedPostgres(fsync="on", full_page_writes="on") as server, \
            tempfile.TemporaryDirectory(prefix="reconcile-rebuild-") as tmp:  # fmt: skip
        db = server.create_database("bench")
        dsn = server.dsn(db)
        with server.connect(db) as conn:
            conn.execute(sql.SQL("CREATE TABLE {} (k bigint PRIMARY KEY, v bigint, w text, "
                                 "_epoch bigint)").format(sql.Identifier(TABLE)))  # fmt: skip
            show = sql.SQL("SELECT current_setting(%s)")
            settings = {
                name: str((conn.execute(show, (name,)).fetchone() or ("",))[0])
                for name in ("server_version", "wal_level", "shared_buffers", "max_wal_size")
            }
        bench = Bench(dsn, rows, step, server.postmaster_pid())
        load_before = os.getloadavg()
        began = time.perf_counter()
        load_through_engine(dsn, Path(tmp) / "store", old, epochs)
        setup_s = time.perf_counter() - began
        print(f"setup: {rows:,} rows through the engine in {setup_s:.1f} s", flush=True)
        # The rebuild first: it moves the store to the new logic; the other two
        # start from the old-logic table reloaded, which needs no store.
        methods["rebuild"] = measure(
            bench, lambda: by_diff(dsn, Path(tmp) / "store", new, part_rows), profile
        )
        for name, method in (("truncate_reload", truncate_reload),
                             ("side_table_swap", side_table_swap)):  # fmt: skip
            print(f"rebuild: {methods['rebuild']['seconds']:.1f} s; now {name}", flush=True)
            reload_old(dsn, old, epochs)
            methods[name] = measure(bench, lambda m=method: m(dsn, new_rows))  # type: ignore[misc]
    by = methods["rebuild"]
    return {
        "benchmark": "rebuild",
        "when": now(),
        "rows_written_vs_changed": round(by["rows_written"] / changed_rows, 4),
        "time_vs_truncate_reload": round(by["seconds"] / methods["truncate_reload"]["seconds"], 4),
        "targets": {"rows_written_vs_changed": 1.1, "time_vs_truncate_reload": 0.5},
        "scale": {
            "rows": rows,
            "changed_fraction": changed,
            "changed_rows": changed_rows,
            "every_nth_key": step,
            "setup_epochs": epochs,
            "setup_s": round(setup_s, 1),
            "part_rows": part_rows,
        },
        "methods": {name: methods[name] for name in METHODS},
        "statistics": "n_tup_ins + n_tup_upd + n_tup_del rises in pg_stat_user_tables; the "
        "benchmark's own writers call pg_stat_force_next_flush(), the engine's sessions are "
        "closed (a backend sends its counters as it exits), and each read follows "
        "pg_stat_clear_snapshot(), until two reads 0.5 s apart agree",
        "machine": machine(
            postgres=settings.pop("server_version").split()[0],
            postgres_settings=settings,
            load_avg_1m_before_after=[round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        ),
        "versions": versions("pyarrow", "psycopg", "deltalake", "numpy"),
    }


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and write its reports."""
    from benchmarks.rebuild.report import markdown, plot

    args = parser().parse_args(argv)
    rows, epochs = (50_000, 5) if args.quick else (args.rows, args.epochs)
    if rows < 2 or not 0 < args.changed <= 1 or epochs < 1 or args.part_rows < 1:
        raise SystemExit("--rows >= 2, 0 < --changed <= 1, --epochs >= 1, --part-rows >= 1")
    profile = args.out / "rebuild_profile.txt" if args.profile else None
    report = run(rows, args.changed, epochs, args.part_rows, profile)
    write_report("rebuild", report, markdown(report), args.out)
    plot(report, args.out)
    print(markdown(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
