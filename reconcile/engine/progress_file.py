"""The file-backed progress log: fsynced JSON lines under a lock file, compacted as it grows."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from reconcile.core import hooks
from reconcile.core.contract import ConfigurationError, FatalError, validate_name
from reconcile.core.durable import fsync_path, write_all, write_atomically
from reconcile.core.progress import (
    EpochStatus,
    ProgressLog,
    ProgressState,
    StateBackedLog,
    numbered,
)

__all__ = ["COMPACTED", "FileProgressLog", "read_progress"]

# Compaction has replaced the log file (the exclusive lock is still held).
COMPACTED = hooks.declare("progress.compacted")


class FileProgressLog(StateBackedLog):
    """Progress log as an fsynced JSON-lines file, one line per entry.

    Every operation first takes a ``flock`` on a lock file beside the log
    (shared to read, exclusive to write) and only then opens the log by its
    path. Appends read what other processes appended first, so a zombie sees
    the newer generation before it writes. A torn last line (a crash
    mid-write) never reached fsync, so it was never acknowledged: it is
    dropped on open, as if it had not been written.

    The log compacts itself: once it holds ``compact_after_lines`` lines, the
    next finalized epoch rewrites it (temp file, fsync, rename) with the state
    alone, keeping the newest ``keep_epochs`` finalized epochs and every epoch
    not finalized yet; older epochs read as UNKNOWN from then on. Because the
    lock is on a separate file, no writer can append to the old file after
    the rename, and a reader that finds a new file (a new inode) reads it from
    the start.

    Another process can read a line that is written but not yet fsynced (the
    page cache is shared) and act on it; only a power loss at that moment
    could then drop a line that was acted on. A local log cannot close that
    window; the expected-state store's log (a Delta table) does.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        pipeline: str,
        *,
        compact_after_lines: int = 30_000,
        keep_epochs: int = 1_000,
    ) -> None:
        validate_name("pipeline", pipeline)
        if keep_epochs < 1 or compact_after_lines < 1:
            raise ConfigurationError("compact_after_lines and keep_epochs must be >= 1")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.path = self.directory / f"{pipeline}.progress.jsonl"
        self.lock_path = self.directory / f"{pipeline}.progress.lock"
        self.compact_after_lines = compact_after_lines
        self.keep_epochs = keep_epochs
        self._state = ProgressState()
        self._offset = 0
        self._lines = 0
        self._inode: int | None = None
        with self._locked(exclusive=True):
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            try:
                self._read_new(fd, repair=True)
                if self._state.log_id is None:
                    # A new log (or one from before identities): give it one, once.
                    self._write_entry(fd, {"t": "id", "log_id": uuid.uuid4().hex})
            finally:
                os.close(fd)
        fsync_path(self.directory)

    @contextlib.contextmanager
    def _locked(self, *, exclusive: bool) -> Iterator[None]:
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            yield
        finally:
            os.close(fd)

    def _read_new(self, fd: int, *, repair: bool) -> None:
        info = os.fstat(fd)
        if info.st_ino != self._inode:
            # A new file: compaction replaced the log. Read it from the start.
            self._state, self._offset, self._lines = ProgressState(), 0, 0
            self._inode = info.st_ino
        if info.st_size <= self._offset:
            return
        chunk = os.pread(fd, info.st_size - self._offset, self._offset)
        end = chunk.rfind(b"\n") + 1
        for line in chunk[:end].splitlines():
            self._state.apply(json.loads(line))
            self._lines += 1
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
        with self._locked(exclusive=False):
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW)
            try:
                self._read_new(fd, repair=False)
            finally:
                os.close(fd)

    def _append(self, entry: dict[str, Any]) -> dict[str, Any]:
        with self._locked(exclusive=True):
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_NOFOLLOW)
            try:
                self._read_new(fd, repair=False)
                # Under the lock, number a new generation and re-check the fence:
                # another process may have claimed one since our caller looked.
                entry = numbered(entry, self._state)
                if entry["t"] in ("epoch", "horizon"):
                    self._state.check_generation(int(entry["gen"]))
                self._write_entry(fd, entry)
            finally:
                os.close(fd)
            finalized = entry.get("status") == EpochStatus.FINALIZED.value
            if finalized and self._lines >= self.compact_after_lines:
                self._compact_locked()
            return entry

    def compact(self, generation: int) -> None:
        """Rewrite the log with its state alone (see the class docstring).

        Raises:
            FencedError: ``generation`` is not the newest.
        """
        with self._locked(exclusive=True):
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW)
            try:
                self._read_new(fd, repair=False)
            finally:
                os.close(fd)
            self._state.check_generation(generation)
            self._compact_locked()

    def _compact_locked(self) -> None:
        """Replace the log file by its state (the exclusive lock is held)."""
        horizon = self._state.compaction_horizon(self.keep_epochs)
        body = b"".join(
            json.dumps(e, sort_keys=True).encode() + b"\n" for e in self._state.snapshot(horizon)
        )
        write_atomically(self.path, body)
        hooks.point(COMPACTED)
        self._inode = None  # read the new file afresh at the next operation
        fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            self._read_new(fd, repair=False)
        finally:
            os.close(fd)

    def _write_entry(self, fd: int, entry: dict[str, Any]) -> None:
        """Append one line at the end (the log is locked exclusively), fsync, apply."""
        line = json.dumps(entry, sort_keys=True).encode() + b"\n"
        os.lseek(fd, 0, os.SEEK_END)
        write_all(fd, line)
        os.fsync(fd)
        self._state.apply(entry)
        self._offset += len(line)
        self._lines += 1


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


_LOG_MEMBERS = ("log_id", "claim_generation", "mark", "status", "last_committed", "epochs_in")


def open_progress_log(
    pipeline: str,
    progress: ProgressLog | str | os.PathLike[str] | None,
    store_log: ProgressLog | None = None,
) -> ProgressLog:
    """The pipeline's progress log: the one given, a FileProgressLog in a folder, or the store's.

    Args:
        pipeline: the pipeline's name.
        progress: a ProgressLog, a folder for a FileProgressLog, or None.
        store_log: the expected state's epochs table, when the cycle has one
            (it is then the progress log, and ``progress`` must be None).

    Raises:
        ConfigurationError: both or neither given, or an object that is no progress log.
    """
    if store_log is not None:
        if progress is not None:
            raise ConfigurationError(
                f"pipeline {pipeline!r}: give a progress log or an expected state, not "
                "both (the expected state's epochs table is the progress log)"
            )
        progress = store_log
    if progress is None:
        raise ConfigurationError(
            f"pipeline {pipeline!r}: a progress log (a folder, or a ProgressLog) or an "
            "expected state is needed to know which epochs are committed"
        )
    if isinstance(progress, str | os.PathLike):
        return FileProgressLog(progress, pipeline)
    missing = [m for m in _LOG_MEMBERS if not hasattr(progress, m)]
    if missing:
        raise ConfigurationError(
            f"pipeline {pipeline!r}: {type(progress).__name__} is not a progress log: it "
            f"lacks {', '.join(missing)} (pass a FileProgressLog, a MemoryProgressLog, "
            "or a folder)"
        )
    return progress
