"""CPU seconds and peak memory of a process tree, sampled from ``/proc``.

The latency benchmark's CPU column, and the scale benchmark's peak memory of
a Spark driver and of its executors.

Hand-written because the figure needed is narrow (every process descended
from a driver, including a JVM that outlives a SIGKILLed parent for a moment)
and psutil is not among the project's dependencies.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

__all__ = ["EXECUTOR_MARKS", "TreeCpu", "machine_busy_s", "own_and_reaped_cpu", "role"]

CLK_TCK = os.sysconf("SC_CLK_TCK")
# A process whose command line holds one of these runs a Spark executor's work:
# the Python workers (forked by the daemon) and, on local-cluster, the executor
# JVMs. Everything else in the tree is the driver (its Python and its JVM, which
# in local mode also runs the executors' JVM side).
EXECUTOR_MARKS = (b"pyspark.daemon", b"pyspark.worker", b"CoarseGrainedExecutorBackend")


def machine_busy_s() -> float:
    """CPU seconds the whole machine has spent busy since boot (every process, the kernel's too).

    Over a run, less the run's own processes and the server's, it is what the
    others on the machine used: the load the run shared the cores with.
    """
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / CLK_TCK


def role(pid: int) -> str:
    """``executors`` or ``driver`` (see ``EXECUTOR_MARKS``), from the command line."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "driver"
    return "executors" if any(mark in cmdline for mark in EXECUTOR_MARKS) else "driver"


def _pss_kb(pid: int) -> int:
    """The process's proportional set size (kB): pages shared by forked workers count once.

    Summed over processes, RSS would count the daemon's pages again in every
    worker it forked; PSS divides each shared page among its sharers.
    """
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _proc_stats() -> dict[int, tuple[int, int, int]]:
    """pid -> (ppid, start time, utime + stime in ticks), for every process now."""
    found: dict[int, tuple[int, int, int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            raw = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        # The command name is in parentheses and may hold spaces: split after it.
        fields = raw.rpartition(")")[2].split()
        found[int(entry)] = (int(fields[1]), int(fields[19]), int(fields[11]) + int(fields[12]))
    return found


class TreeCpu(threading.Thread):
    """CPU seconds of every process descended from the roots, sampled from /proc.

    A process's last sample counts (utime + stime, its own only: a reaped
    child's time is counted from the child's own samples, not again from its
    parent's cutime). Processes orphaned by a killed root (the JVM outlives a
    SIGKILLed driver for a moment) are followed until they exit. The CPU a
    process spends after its last sample (at most ``every``) is not counted.
    """

    def __init__(self, every: float = 0.2) -> None:
        super().__init__(daemon=True, name="tree-cpu")
        self.every = every
        self.roots: set[int] = set()
        self.ticks: dict[tuple[int, int], int] = {}
        self.done = threading.Event()
        self.lock = threading.Lock()
        self.peak_mb: dict[str, float] = {}  # role -> the highest sum of PSS at one sample

    def add_root(self, pid: int) -> None:
        with self.lock:
            self.roots.add(pid)

    def sample(self) -> int:
        """One sample; the number of tracked processes still alive."""
        stats = _proc_stats()
        children: dict[int, list[int]] = {}
        for pid, (ppid, _, _) in stats.items():
            children.setdefault(ppid, []).append(pid)
        with self.lock:
            frontier = [p for p in self.roots if p in stats]
            frontier += [
                pid for pid, start in self.ticks if pid in stats and stats[pid][1] == start
            ]
            alive = 0
            seen: set[int] = set()
            memory: dict[str, int] = {}
            while frontier:
                pid = frontier.pop()
                if pid in seen or pid not in stats:
                    continue
                seen.add(pid)
                alive += 1
                _, start, ticks = stats[pid]
                self.ticks[(pid, start)] = max(ticks, self.ticks.get((pid, start), 0))
                # Read at every sample: a process just forked, before its exec,
                # still shows its parent's command line.
                kind = role(pid)
                memory[kind] = memory.get(kind, 0) + _pss_kb(pid)
                frontier += children.get(pid, [])
            for kind, kb in memory.items():
                self.peak_mb[kind] = max(self.peak_mb.get(kind, 0.0), round(kb / 1024, 1))
        return alive

    def run(self) -> None:
        while not self.done.wait(self.every):
            self.sample()

    def finish(self, linger: float = 15.0) -> float:
        """Stop, once the tracked processes are gone (or after ``linger``); CPU seconds."""
        self.done.set()
        self.join()
        deadline = time.monotonic() + linger
        while self.sample() and time.monotonic() < deadline:
            time.sleep(self.every)
        return sum(self.ticks.values()) / CLK_TCK


def own_and_reaped_cpu(pid: int) -> float:
    """utime + stime + cutime + cstime of ``pid`` in seconds (0 if it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return sum(int(fields[i]) for i in (11, 12, 13, 14)) / CLK_TCK
