"""The demo's event log: one JSON object per line, appended by every process of a run.

The pipeline process appends what the engine reports while it runs (an
ambiguous COMMIT and how it was resolved, an epoch replayed into a sink, the
rows a recovery applied, each committed batch); the supervisor appends the
launches, the kills and the faults it injected. A line is written with one
``write`` on a file opened for appending, so a SIGKILL loses at most the line
being written, and a resumed demo adds to the same log: the summary counts
over every run.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["EventLog", "EventMetrics"]

# The engine's counters the demo reports (see reconcile.core.metrics for their meaning).
_COUNTED = ("commit.ambiguous", "sink.commit.replayed", "recovery.committed",
            "recovery.aborted", "drive.retries")  # fmt: skip


class EventLog:
    """Append-only JSON lines at ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, event: str, **fields: Any) -> None:
        record = {"event": event, "t": time.time(), "pid": os.getpid(), **fields}
        line = json.dumps(record, default=str) + "\n"
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)

    def read(self) -> Iterator[dict[str, Any]]:
        """Every whole line so far (a torn last line of a killed writer is skipped)."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return
        for line in text.splitlines():
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue

    def of(self, event: str) -> list[dict[str, Any]]:
        return [e for e in self.read() if e.get("event") == event]


class EventMetrics:
    """A ``reconcile.core.metrics.Metrics`` that logs the counters the demo reports.

    It also logs ``first_commit`` (``at``: the engine's ``cycle.last_commit_time``)
    when the process's first epoch is in every sink: the step of a restart
    that the latency benchmark calls resumed.
    """

    def __init__(self, log: EventLog) -> None:
        self.log = log
        self._committed = False

    def count(self, name: str, value: int = 1, **labels: str) -> None:
        if value and name in _COUNTED:
            self.log.write("metric", name=name, value=value, labels=labels)

    def observe(self, name: str, seconds: float, **labels: str) -> None:
        """Durations are not logged."""

    def set(self, name: str, value: float, **labels: str) -> None:
        """Gauges are not logged, but for the process's first commit time."""
        if name == "cycle.last_commit_time" and not self._committed:
            self._committed = True
            self.log.write("first_commit", at=value)
