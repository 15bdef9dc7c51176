"""Failovers of the demo pipeline: a main and a standby, the leader killed or paused, repeatedly.

``run_failovers(options)`` generates the demo's data, starts two pipeline
processes on one work folder (``main`` and ``standby``, ``reconcile.ha``),
drops lineitem files, and, each time the leader has committed a few epochs
and another process is a warm standby (it logged ``ready``), faults it:

- ``kill``: SIGKILL from outside at a random moment, or (seeded) at a named
  point the process reaches itself (armed at launch, its gate opened by the
  harness at the moment of the fault), between the store commit and the sink
  commit first; the killed process is started again as a standby;
- ``pause``: SIGSTOP for three lease terms, until the standby leads and has
  committed an epoch; then SIGCONT: the woken main must step down and write
  nothing more.

Takeover time is read from Postgres: from the fault to the commit time of the
first marker of the new leader's generation for an epoch of its own (after
the newest epoch decided before the takeover, which its recovery may finish).
At the end both tables are audited against the expected state and against
TPC-H itself.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from reconcile.demo.tpch.data import Feed, generate
from reconcile.demo.tpch.events import EventLog
from reconcile.demo.tpch.failover_observe import (
    commits_of,
    first_marker,
    leading_now,
    markers_after,
)
from reconcile.demo.tpch.summary import Summary, audit, row_latencies
from reconcile.demo.tpch.supervisor import Feeder, Options, launch_pipeline, prepare_tables

__all__ = ["Failover", "FailoverOptions", "FailoverRun", "run_failovers"]

# Named points a leader is killed at (``reconcile.core.hooks``), in this order first.
POINTS = ("cycle.expected_state.recorded", "pg.commit.returned", "cycle.decided")


@dataclass
class FailoverOptions:
    """What to run: the workload, how many faults of which kind, the lease term."""

    workdir: Path
    dsn: str
    failovers: int = 3
    fault: str = "kill"  # "kill", "pause" or "mixed"
    seed: int = 1
    scale: float = 0.01
    epochs: int = 60
    interval: float = 0.5
    term_s: float = 2.0
    commits_between: int = 2  # epochs the leader commits before the next fault
    named_points: bool = True  # some kills at named points (seeded), not only from outside
    outside_share: float = 0.5  # of the kills, the share from outside at a random moment
    master: str = "local[2,4]"
    timeout_s: float = 900.0


@dataclass
class Failover:
    """One fault and the takeover that followed."""

    fault: str  # "kill", "kill at <point>", "pause"
    old_pid: int
    old_generation: int | None
    old_tenure: int
    new_pid: int | None = None
    new_generation: int | None = None
    fault_at: float = 0.0
    first_commit_at: float | None = None  # the new generation's first marker commit
    takeover_s: float | None = None
    old_wrote_after: int = 0  # markers of the old generation committed after the fault
    stepped_down: bool | None = None  # pause: the woken main stepped down


@dataclass
class FailoverRun:
    """Every failover, the audit, and the latencies around the faults."""

    failovers: list[Failover] = field(default_factory=list)
    summary: Summary | None = None
    max_latency_ms: float | None = None
    max_latency_in_failover_ms: float | None = None
    processes: int = 0
    # Processes that ended other than by SIGKILL or a clean exit (a crash of
    # the pipeline itself, not a fault of the run): (pid, return code).
    unexpected_exits: list[tuple[int, int]] = field(default_factory=list)


class _Procs:
    """The pipeline processes, launched and relaunched."""

    def __init__(self, options: FailoverOptions, demo: Options) -> None:
        self.options, self.demo = options, demo
        self.launches = 0
        self.procs: list[subprocess.Popen[bytes]] = []
        self.replaced: set[int] = set()
        self.plan: Any = lambda: None  # the kill plan of a relaunched process
        self.plans: dict[int, tuple[str, int] | None] = {}
        # During a takeover, a dead process is not started again until the new
        # leader has committed (unless nobody is left): its start-up (a JVM,
        # Spark, a warm-up) would share these cores with the takeover, as it
        # would not with main and standby on hosts of their own.
        self.hold = False

    def respawn(self) -> None:
        """Start a standby in place of every process that died (killed, or at its point).

        So that there is always another process to take over, even when a new
        leader dies at its own kill point before its first commit.
        """
        if self.hold and any(p.poll() is None for p in self.procs):
            return
        for proc in list(self.procs):
            if proc.poll() is not None and proc.returncode != 0 and proc.pid not in self.replaced:
                self.replaced.add(proc.pid)
                self.start("standby", self.plan())

    def gate(self, proc: subprocess.Popen[bytes]) -> Path:
        """The file whose creation arms ``proc``'s kill point (``reconcile.core.hooks``)."""
        return self.options.workdir / "kills" / f"gate-{self.procs.index(proc)}"

    def start(self, role: str, kill: tuple[str, int] | None) -> subprocess.Popen[bytes]:
        extra = {"RECONCILE_DEMO_LEASE_S": str(self.options.term_s),
                 "RECONCILE_KILL_GATE": str(self.options.workdir / "kills" /
                                            f"gate-{self.launches}")}  # fmt: skip
        proc = launch_pipeline(self.options.workdir, self.demo, self.options.dsn,
                               self.launches, kill, role=role, env_extra=extra)  # fmt: skip
        self.launches += 1
        self.procs.append(proc)
        self.plans[proc.pid] = kill
        return proc

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGCONT)
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _wait(what: str, check: Any, deadline: float, procs: _Procs, step: float = 0.2) -> Any:
    while time.time() < deadline:
        procs.respawn()
        found = check()
        if found:
            return found
        time.sleep(step)
    procs.stop_all()
    raise TimeoutError(f"failover run: timed out waiting for {what}")


def _wait_leader(events: EventLog, procs: _Procs, deadline: float) -> tuple[int, int | None, int]:
    alive = {p.pid for p in procs.procs if p.poll() is None}
    found: tuple[int, int | None, int] = _wait("a leader", lambda: leading_now(events, alive),
                                               deadline, procs)  # fmt: skip
    return found


def _ready_standby(events: EventLog, procs: _Procs, leader: int) -> int | None:
    """A live process, other than ``leader``, that has warmed itself as a standby."""
    alive = {p.pid for p in procs.procs if p.poll() is None} - {leader}
    return next((e["pid"] for e in events.of("ready") if e["pid"] in alive), None)


def _wait_commits(
    events: EventLog, procs: _Procs, deadline: float, pid: int, tenure: int, n: int
) -> None:
    proc = next(p for p in procs.procs if p.pid == pid)
    _wait(f"{n} commits of the leader",
          lambda: commits_of(events, pid, tenure) >= n or proc.poll() is not None,
          deadline, procs)  # fmt: skip


def _finish(procs: _Procs, deadline: float) -> None:
    """Let the stream finish: every process stops once every line is in.

    A process may still die at the named point it was launched with, after the
    last planned fault; one is then started in its place (with no kill point),
    or nobody might be left to finish the stream.
    """
    procs.plan = lambda: None

    def finished() -> bool:
        return all(p.poll() is not None and (p.returncode == 0 or p.pid in procs.replaced)
                   for p in procs.procs)  # fmt: skip

    _wait("the stream to finish", finished, deadline, procs, 0.5)


def run_failovers(options: FailoverOptions) -> FailoverRun:
    """Run the workload through ``options.failovers`` faults of the leader; what happened."""
    workdir = options.workdir
    workdir.mkdir(parents=True, exist_ok=True)
    rng = random.Random(options.seed)
    deadline = time.time() + options.timeout_s
    events = EventLog(workdir / "events.jsonl")
    feed = Feed(generate(workdir / "tpch", options.scale), workdir / "inbox", options.epochs)
    prepare_tables(options.dsn, resumed=False, reset=True)
    demo = Options(scale=options.scale, epochs=options.epochs, interval=options.interval,
                   master=options.master)  # fmt: skip
    procs = _Procs(options, demo)
    points = list(POINTS)

    def kill_plan() -> tuple[str, int] | None:
        if (options.fault == "pause" or not options.named_points
                or rng.random() < options.outside_share):  # fmt: skip
            return None  # killed from outside at a random moment
        # Hits count once the harness opens the process's gate (when it leads,
        # has committed, and a standby is warm); a point is reached once or
        # twice per epoch.
        nth = rng.randint(1, 2)
        return (points.pop(0) if points else rng.choice(POINTS)), nth

    procs.plan = kill_plan
    # Either process may win the first lease (the standby does when the main's
    # start is the slower one), so both carry the first plan: the first fault
    # is the planned one whichever leads. Only the leader's gate is opened.
    first = kill_plan()
    procs.start("main", first)
    procs.start("standby", first)
    started = threading.Event()
    feeder = Feeder(feed, options.interval, started)
    feeder.start()
    run = FailoverRun()
    try:
        for number in range(options.failovers):
            pid, generation, tenure = _wait_leader(events, procs, deadline)
            started.set()
            _wait_commits(events, procs, deadline, pid, tenure, options.commits_between)
            # A hot standby is what is measured: fault only once one is warm.
            _wait("a warm standby", lambda leader=pid: _ready_standby(events, procs, leader),
                  deadline, procs)  # fmt: skip
            proc = next(p for p in procs.procs if p.pid == pid)
            kind = options.fault
            if kind == "mixed":
                kind = "pause" if number % 2 else "kill"
            if kind == "pause":
                done = _pause(options, events, procs, proc, (generation, tenure), deadline)
            else:
                done = _kill(options, events, procs, proc, (generation, tenure),
                             procs.plans.get(pid), deadline)  # fmt: skip
            run.failovers.append(done)
        _finish(procs, deadline)
    finally:
        feeder.stop.set()
        procs.stop_all()
    run.processes = procs.launches
    run.unexpected_exits = [(p.pid, p.returncode) for p in procs.procs
                            if p.returncode not in (0, -signal.SIGKILL, None)]  # fmt: skip
    run.summary = audit(options.dsn, workdir, feed, events, options.epochs)
    with psycopg.connect(options.dsn, autocommit=True) as conn:
        # Row latencies need commit timestamps; without them there are none to report.
        tracked = conn.execute("SHOW track_commit_timestamp").fetchone()
        rows = row_latencies(conn, feed) if tracked and tracked[0] == "on" else []
    if rows:
        run.max_latency_ms = 1000 * max(latency for _, latency in rows)
        # A file dropped during a failover (from the fault to the new leader's
        # first commit) waited for the takeover: its rows show the gap.
        windows = [(f.fault_at, f.first_commit_at) for f in run.failovers if f.first_commit_at]
        dropped = {s.index: feed.path(s.index).stat().st_mtime for s in feed.slices
                   if feed.path(s.index).exists()}  # fmt: skip
        around = [latency for index, latency in rows
                  if any(a <= dropped.get(index, 0) <= b for a, b in windows)]  # fmt: skip
        run.max_latency_in_failover_ms = 1000 * max(around) if around else None
    return run


def _kill(
    options: FailoverOptions,
    events: EventLog,
    procs: _Procs,
    proc: subprocess.Popen[bytes],
    led: tuple[int | None, int],
    plan: tuple[str, int] | None,
    deadline: float,
) -> Failover:
    """Kill the leader (or let it die at its named point); wait for the new leader's commit."""
    if plan is not None:
        # It dies by itself at the point once its gate is open; the kill file
        # is written just before.
        procs.gate(proc).touch()
        _wait(f"the leader to die at {plan[0]}", lambda: proc.poll() is not None, deadline,
              procs, 0.05)  # fmt: skip
        kill_file = options.workdir / "kills" / f"launch-{procs.procs.index(proc)}"
        fault_at = kill_file.stat().st_mtime if kill_file.exists() else time.time()
        kind = f"kill at {plan[0]}" if kill_file.exists() else "exit"
    else:
        fault_at = time.time()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        kind = "kill"
    done = Failover(kind, proc.pid, *led, fault_at=fault_at)
    _takeover(options, events, procs, done, deadline)
    return done


def _pause(
    options: FailoverOptions,
    events: EventLog,
    procs: _Procs,
    proc: subprocess.Popen[bytes],
    led: tuple[int | None, int],
    deadline: float,
) -> Failover:
    """SIGSTOP the leader past its lease; SIGCONT once the standby committed; it must step down."""
    fault_at = time.time()
    os.kill(proc.pid, signal.SIGSTOP)
    generation = led[0]
    done = Failover("pause", proc.pid, *led, fault_at=fault_at)
    _takeover(options, events, procs, done, deadline)
    # Paused for at least three terms, so that its lease surely ran out.
    time.sleep(max(0.0, fault_at + 3 * options.term_s - time.time()))
    woke = time.time()
    os.kill(proc.pid, signal.SIGCONT)
    done.stepped_down = bool(_wait(
        "the woken main to step down",
        lambda: any(e["pid"] == proc.pid and e["t"] >= woke for e in events.of("stepped_down")),
        deadline, procs,
    ))  # fmt: skip
    if generation is not None:
        done.old_wrote_after = markers_after(options.dsn, generation, fault_at)
    return done


def _takeover(
    options: FailoverOptions, events: EventLog, procs: _Procs, done: Failover, deadline: float
) -> None:
    """Wait until another process leads and its generation committed a marker."""

    def new_leader() -> tuple[int, int | None, int] | None:
        alive = {p.pid for p in procs.procs if p.poll() is None} - {done.old_pid}
        found = leading_now(events, alive, above=done.old_tenure)
        return found if found is not None and found[1] is not None else None

    procs.hold = True
    try:
        _wait_takeover(options, events, procs, done, deadline, new_leader)
    finally:
        procs.hold = False
    if done.old_generation is not None and done.fault != "pause":
        done.old_wrote_after = markers_after(options.dsn, done.old_generation, done.fault_at)


def _wait_takeover(
    options: FailoverOptions,
    events: EventLog,
    procs: _Procs,
    done: Failover,
    deadline: float,
    new_leader: Any,
) -> None:
    """The new leader, and the commit time of its first epoch of its own, into ``done``."""
    pid, generation, tenure = _wait("a new leader", new_leader, deadline, procs)
    done.new_pid, done.new_generation = pid, generation
    assert generation is not None
    led = [e for e in events.of("leading") if (e["pid"], e["tenure"]) == (pid, tenure)]
    recovered_to = led[0].get("recovered_to") if led else None
    first = _wait("the new leader's first commit",
                  lambda: first_marker(options.dsn, generation, recovered_to),
                  deadline, procs)  # fmt: skip
    done.first_commit_at = first
    done.takeover_s = first - done.fault_at
