"""The progress log: the durable record of which epochs are decided, committed, finalized."""

from __future__ import annotations

import enum
import fcntl
import json
import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from reconcile import hooks
from reconcile.contract import (
    ConfigurationError,
    FatalError,
    FencedError,
    InvalidInputError,
    validate_name,
)
from reconcile.durable import fsync_path, write_all

__all__ = [
    "EpochStatus",
    "FileProgressLog",
    "MemoryProgressLog",
    "ProgressLog",
    "ProgressState",
    "read_progress",
]

# The window between a writer's fence check and its locked append: a takeover
# that lands here must still be caught by the re-check under the lock.
MARK_CHECKED = hooks.declare("progress.mark.fence_checked")


class EpochStatus(enum.Enum):
    """Where an epoch stands in the commit cycle, as far as the durable log knows."""

    DECIDED = "decided"  # outputs staged, progress recorded; not yet the commit point
    COMMITTED = "committed"  # the commit point: every sink must end up with this epoch
    FINALIZED = "finalized"  # every sink committed it; nothing left to do
    ABORTED = "aborted"  # no sink may keep it; the epoch will be retried
    UNKNOWN = "unknown"  # older than what the log still holds (truncated)


# Allowed transitions. Writing the status an epoch already has is a no-op (I3).
_NEXT: dict[EpochStatus | None, set[EpochStatus]] = {
    None: {EpochStatus.DECIDED, EpochStatus.ABORTED},
    EpochStatus.DECIDED: {EpochStatus.COMMITTED, EpochStatus.ABORTED},
    EpochStatus.ABORTED: {EpochStatus.DECIDED},
    EpochStatus.COMMITTED: {EpochStatus.FINALIZED},
    EpochStatus.FINALIZED: set(),
}


class ProgressLog(Protocol):
    """Durable record of progress: which epochs are decided, committed, finalized.

    Writes carry the writer's generation; a write from a generation older than
    the newest claimed one raises FencedError (I5). ``log_id`` identifies the
    log itself: it is fixed at creation, so sinks can tell this pipeline's
    commits from those of another (or a wiped and recreated) state.
    """

    @property
    def log_id(self) -> str:
        """The log's identity, fixed when it was created."""
        ...

    def claim_generation(self) -> int:
        """Start a new writer generation and fence every older one. Returns it."""
        ...

    def mark(self, epoch: int, status: EpochStatus, generation: int) -> None:
        """Durably move ``epoch`` to ``status``. Idempotent; illegal moves raise FatalError."""
        ...

    def status(self, epoch: int) -> EpochStatus | None:
        """The epoch's status; None if never recorded, UNKNOWN if truncated away."""
        ...

    def last_committed(self) -> int | None:
        """The newest epoch that reached COMMITTED (or FINALIZED), if any."""
        ...

    def epochs_in(self, status: EpochStatus) -> list[int]:
        """Every epoch currently in ``status``, ascending."""
        ...


@dataclass
class ProgressState:
    """The pure state machine behind every progress log: entries in, statuses out."""

    generation: int = 0
    log_id: str | None = None  # set by the log's first entry
    horizon: int = 0  # epochs below this were truncated; their status is UNKNOWN
    statuses: dict[int, EpochStatus] = field(default_factory=dict)
    last_committed: int | None = None

    def check_generation(self, generation: int) -> None:
        if generation < self.generation:
            raise FencedError(
                f"progress log write by generation {generation} rejected: generation "
                f"{self.generation} has taken over (this writer is a zombie and must stop)",
                generation=generation,
                current=self.generation,
            )

    def check_move(self, epoch: int, status: EpochStatus) -> bool:
        """True if the move changes something; raise FatalError if it is illegal."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise InvalidInputError(f"epoch must be an int >= 0, got {epoch!r}")
        current = self.status_of(epoch)
        if current == status:
            return False
        if current is EpochStatus.UNKNOWN or status not in _NEXT[current]:
            raise FatalError(
                f"progress log: epoch {epoch} cannot move from "
                f"{current.value if current else 'unrecorded'} to {status.value}",
                epoch=epoch,
            )
        return True

    def status_of(self, epoch: int) -> EpochStatus | None:
        if epoch in self.statuses:
            return self.statuses[epoch]
        return EpochStatus.UNKNOWN if epoch < self.horizon else None

    def apply(self, entry: dict[str, Any]) -> None:
        kind = entry["t"]
        if kind == "id":
            # The first identity wins: a second one (two creators racing) is ignored.
            self.log_id = self.log_id or str(entry["log_id"])
        elif kind == "gen":
            self.generation = max(self.generation, int(entry["gen"]))
        elif kind == "epoch":
            epoch, status = int(entry["epoch"]), EpochStatus(entry["status"])
            self.statuses[epoch] = status
            if status in (EpochStatus.COMMITTED, EpochStatus.FINALIZED):
                self.last_committed = max(epoch, self.last_committed or 0)
        elif kind == "horizon":
            self.horizon = max(self.horizon, int(entry["epoch"]))
            for epoch in [e for e in self.statuses if e < self.horizon]:
                del self.statuses[epoch]
        else:
            raise FatalError(f"progress log: unknown entry type {kind!r}")

    def epochs_in(self, status: EpochStatus) -> list[int]:
        return sorted(e for e, s in self.statuses.items() if s is status)


class _StateBackedLog:
    """Shared logic of the log backends; subclasses persist entries in ``_append``."""

    _state: ProgressState

    def _append(self, entry: dict[str, Any]) -> dict[str, Any]:
        """Persist ``entry`` and apply it; a ``gen`` entry gets its number here."""
        raise NotImplementedError

    def _refresh(self) -> None:
        """Pick up entries written by other writers (a newer generation, say)."""

    def claim_generation(self) -> int:
        return int(self._append({"t": "gen"})["gen"])

    @property
    def log_id(self) -> str:
        if self._state.log_id is None:
            raise FatalError("progress log has no identity entry")
        return self._state.log_id

    def mark(self, epoch: int, status: EpochStatus, generation: int) -> None:
        self._refresh()
        self._state.check_generation(generation)
        if self._state.check_move(epoch, status):
            hooks.point(MARK_CHECKED)
            self._append({"t": "epoch", "epoch": epoch, "status": status.value, "gen": generation})

    def status(self, epoch: int) -> EpochStatus | None:
        self._refresh()
        return self._state.status_of(epoch)

    def last_committed(self) -> int | None:
        self._refresh()
        return self._state.last_committed

    def epochs_in(self, status: EpochStatus) -> list[int]:
        self._refresh()
        return self._state.epochs_in(status)

    def truncate(self, before_epoch: int, generation: int) -> None:
        """Forget finalized epochs below ``before_epoch`` (housekeeping).

        Raises:
            FatalError: if an epoch below it is not finalized yet; recovery
                still needs its status.
        """
        self._refresh()
        self._state.check_generation(generation)
        pending = [
            e
            for e, s in self._state.statuses.items()
            if e < before_epoch and s is not EpochStatus.FINALIZED
        ]
        if pending:
            raise FatalError(
                f"progress log: cannot truncate below {before_epoch}: "
                f"epochs {pending} are not finalized"
            )
        self._append({"t": "horizon", "epoch": before_epoch, "gen": generation})


class MemoryProgressLog(_StateBackedLog):
    """Progress log in memory: "durable" for as long as the object lives (tests)."""

    def __init__(self) -> None:
        self._state = ProgressState(log_id=uuid.uuid4().hex)

    def _append(self, entry: dict[str, Any]) -> dict[str, Any]:
        entry = _numbered(entry, self._state)
        self._state.apply(entry)
        return entry


class FileProgressLog(_StateBackedLog):
    """Progress log as an fsynced JSON-lines file, one line per entry.

    Appends take an exclusive ``flock`` and first read what other processes
    appended, so a zombie sees the newer generation before it writes. A torn
    last line (a crash mid-write) never reached fsync, so it was never
    acknowledged: it is dropped on open, as if it had not been written.

    Another process can read a line that is written but not yet fsynced (the
    page cache is shared) and act on it; only a power loss at that moment
    could then drop a line that was acted on. A local log cannot close that
    window; the Delta-backed log of a later issue does.
    """

    def __init__(self, directory: str | os.PathLike[str], pipeline: str) -> None:
        validate_name("pipeline", pipeline)
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.path = self.directory / f"{pipeline}.progress.jsonl"
        self._state = ProgressState()
        self._offset = 0
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            self._read_new(fd, repair=True)
            if self._state.log_id is None:
                # A new log (or one from before identities): give it one, once.
                entry = {"t": "id", "log_id": uuid.uuid4().hex}
                self._write_entry(fd, entry)
        finally:
            os.close(fd)
        fsync_path(self.directory)

    def _read_new(self, fd: int, *, repair: bool) -> None:
        size = os.fstat(fd).st_size
        if size <= self._offset:
            return
        chunk = os.pread(fd, size - self._offset, self._offset)
        end = chunk.rfind(b"\n") + 1
        for line in chunk[:end].splitlines():
            self._state.apply(json.loads(line))
        self._offset += end
        if end < len(chunk):
            if not repair:
                raise FatalError(
                    f"progress log {self.path} has a torn entry at byte {self._offset}"
                )
            # Torn tail: never fsynced, so never acknowledged. Drop it.
            os.ftruncate(fd, self._offset)
            os.fsync(fd)

    def _refresh(self) -> None:
        fd = os.open(self.path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            self._read_new(fd, repair=False)
        finally:
            os.close(fd)

    def _append(self, entry: dict[str, Any]) -> dict[str, Any]:
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            self._read_new(fd, repair=False)
            # Under the lock, number a new generation and re-check the fence:
            # another process may have claimed one since our caller looked.
            entry = _numbered(entry, self._state)
            if entry["t"] in ("epoch", "horizon"):
                self._state.check_generation(int(entry["gen"]))
            self._write_entry(fd, entry)
            return entry
        finally:
            os.close(fd)

    def _write_entry(self, fd: int, entry: dict[str, Any]) -> None:
        """Append one line at the end (the fd is locked exclusively), fsync, apply."""
        line = json.dumps(entry, sort_keys=True).encode() + b"\n"
        os.lseek(fd, 0, os.SEEK_END)
        write_all(fd, line)
        os.fsync(fd)
        self._state.apply(entry)
        self._offset += len(line)


def read_progress(directory: str | os.PathLike[str], pipeline: str) -> ProgressState:
    """Read a pipeline's file progress log without writing anything (for ``status``).

    A torn last line is ignored, not repaired; nothing is created.

    Raises:
        ConfigurationError: the log does not exist (naming the path).
    """
    validate_name("pipeline", pipeline)
    path = Path(directory) / f"{pipeline}.progress.jsonl"
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ConfigurationError(
            f"no progress log for pipeline {pipeline!r} at {path}", path=str(path)
        ) from None
    state = ProgressState()
    for line in data[: data.rfind(b"\n") + 1].splitlines():
        state.apply(json.loads(line))
    return state


def _numbered(entry: dict[str, Any], state: ProgressState) -> dict[str, Any]:
    """Give a generation claim the number after the newest one seen."""
    if entry["t"] == "gen":
        return {"t": "gen", "gen": state.generation + 1}
    return entry
