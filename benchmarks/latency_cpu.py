"""CPU seconds of a process tree, sampled from ``/proc`` (the latency benchmark's CPU column).

Hand-written because the figure needed is narrow (every process descended
from a driver, including a JVM that outlives a SIGKILLed parent for a moment)
and psutil is not among the project's dependencies.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

__all__ = ["TreeCpu", "own_and_reaped_cpu"]

CLK_TCK = os.sysconf("SC_CLK_TCK")


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
            while frontier:
                pid = frontier.pop()
                if pid in seen or pid not in stats:
                    continue
                seen.add(pid)
                alive += 1
                _, start, ticks = stats[pid]
                self.ticks[(pid, start)] = max(ticks, self.ticks.get((pid, start), 0))
                frontier += children.get(pid, [])
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
