"""The latency benchmark's run of one mode: launch its process, feed it, kill it, launch it again.

The process is the mode's own (``Mode.command``); the kills are the engine's
fault points (``RECONCILE_KILL_AT``), which the dying process proves by a
file; each launch's pid and wall time are kept for the restart timeline
(``benchmarks.latency.restart``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg

from benchmarks.latency.cpu import TreeCpu, machine_busy_s, own_and_reaped_cpu
from benchmarks.latency.feed import Feeder
from benchmarks.latency.measure import Run

__all__ = ["execute"]

ROOT = Path(__file__).resolve().parents[2]


def _visible_rows(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM public.demo_lineitem").fetchone()
    return int(row[0]) if row else 0


def _launch(run: Run, master: str, launch: int) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, BENCH_DSN=run.dsn,
               RECONCILE_DEMO_DSN=run.dsn)  # fmt: skip
    env.pop("RECONCILE_KILL_AT", None)
    env.pop("RECONCILE_KILL_ONCE", None)
    if launch < len(run.kills):
        point, nth = run.kills[launch]
        env["RECONCILE_KILL_AT"] = f"{point}:{nth}"
        # Spark's Python workers inherit the variable: only the first process to
        # reach the point dies, and the file proves that the kill fired.
        env["RECONCILE_KILL_ONCE"] = str(run.workdir / "kills" / f"launch-{launch}")
    (run.workdir / "logs").mkdir(exist_ok=True)
    (run.workdir / "kills").mkdir(exist_ok=True)
    with open(run.workdir / "logs" / f"launch-{launch}.log", "wb") as log:
        return subprocess.Popen(
            run.mode.command(run.workdir, run.epochs, run.trigger, master,
                             run.feed.lineitem.num_rows),
            env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip


def _tail(path: Path, chars: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except FileNotFoundError:
        return ""


def execute(run: Run, master: str, postmaster: int, timeout: float) -> None:
    """Run the mode to the end: warm-up, paced feed, kills and restarts."""
    cpu = TreeCpu()
    cpu.start()
    pg_before = own_and_reaped_cpu(postmaster)
    machine_before = machine_busy_s()
    began = time.monotonic()
    deadline = began + timeout
    feeder = Feeder(run.feed, run.trigger, seed=run.phase_seed)
    launch = 0
    at = time.time()
    proc = _launch(run, master, launch)
    run.launches.append((proc.pid, at))
    cpu.add_root(proc.pid)
    # Warm-up: file 0 alone, until its rows are visible (Spark up, the first batch
    # compiled, a first checkpoint for two-phase); then the paced feed.
    run.feed.drop(0)
    warm = run.feed.slices[0].rows
    try:
        while True:
            code = proc.poll()
            if not feeder.is_alive() and not feeder.start_at and _visible_rows(run.dsn) >= warm:
                run.feed_started = time.time()
                feeder.start()
            if time.monotonic() > deadline:
                raise TimeoutError(f"{run.mode.name} at {run.trigger}s did not finish")
            if code is None:
                time.sleep(0.1)
                continue
            if code == 0:
                break
            kill_file = run.workdir / "kills" / f"launch-{launch}"
            if code == -signal.SIGKILL and kill_file.exists():
                run.crashes.append(f"{run.kills[launch][0]}:{run.kills[launch][1]}")
            else:
                run.failures += 1
                log = run.workdir / "logs" / f"launch-{launch}.log"
                if run.failures > 2:
                    raise RuntimeError(f"{run.mode.name} failed ({code}):\n{_tail(log)}")
                print(f"  {run.mode.name}: exit {code}, restarting", flush=True)
            launch += 1
            at = time.time()
            proc = _launch(run, master, launch)
            run.launches.append((proc.pid, at))
            cpu.add_root(proc.pid)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        feeder.stop.set()
        run.wall_s = time.monotonic() - began
        run.cpu_s = cpu.finish()
        run.peak_mb = dict(cpu.peak_mb)
        # The server's backends of this run have exited (the driver closed its
        # sessions): the postmaster has reaped them, and their CPU is in its cutime.
        time.sleep(0.5)
        run.pg_cpu_s = own_and_reaped_cpu(postmaster) - pg_before
        run.machine_cpu_s = machine_busy_s() - machine_before
