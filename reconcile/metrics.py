"""A small metrics interface: counters and step timings, exported by later issues."""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

__all__ = ["InMemoryMetrics", "Metrics", "NullMetrics", "timed"]


class Metrics(Protocol):
    """Where the engine reports what it did. Names are dotted, e.g. ``cycle.outcome.aborted``."""

    def count(self, name: str, value: int = 1) -> None:
        """Add ``value`` to counter ``name``."""
        ...

    def observe(self, name: str, seconds: float) -> None:
        """Record one duration for ``name``."""
        ...


class NullMetrics:
    """Discards everything."""

    def count(self, name: str, value: int = 1) -> None:
        pass

    def observe(self, name: str, seconds: float) -> None:
        pass


class InMemoryMetrics:
    """Keeps counters and every observed duration, for tests and reports."""

    def __init__(self) -> None:
        self.counters: Counter[str] = Counter()
        self.timings: defaultdict[str, list[float]] = defaultdict(list)

    def count(self, name: str, value: int = 1) -> None:
        self.counters[name] += value

    def observe(self, name: str, seconds: float) -> None:
        self.timings[name].append(seconds)

    def summary(self) -> dict[str, object]:
        """Counters, and count / total / max seconds per timing, as plain data."""
        return {
            "counters": dict(self.counters),
            "timings": {
                name: {"count": len(v), "total_s": sum(v), "max_s": max(v)}
                for name, v in self.timings.items()
                if v
            },
        }


@contextmanager
def timed(metrics: Metrics, name: str) -> Iterator[None]:
    """Observe the wall-clock duration of the block under ``name``, even when it raises."""
    start = time.perf_counter()
    try:
        yield
    finally:
        metrics.observe(name, time.perf_counter() - start)
