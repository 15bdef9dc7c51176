"""Holds: a reader keeps the store version it reads from housekeeping while it reads.

A ``verify``, ``repair`` or ``rebuild`` reads a store table at one Delta
version, for as long as its pull and diff take, while the pipeline goes on
merging and vacuuming. Within :meth:`Holding.holding`, every version the
store's reads resolve (``files_at``, ``changed_keys``, ``check_version``,
``state_at_version``: the one place each reader goes through, :meth:`_hold`)
is written down in a small durable record under the table's folder::

    <table>/_holds/<host>-<pid>-<token>.json
        {"versions": [12, 40], "lease_s": 120, "expires": <unix time>, "pid": ..., "host": ...}

``vacuum()`` keeps the files and the log entries of every held version,
whatever their age (:func:`held_versions`). A thread of the holder renews the
lease (``expires``) every quarter of its term; the record is deleted when the
scope ends (``finally``). A holder killed outright (SIGKILL, a lost host) stops
renewing, and its record is ignored, then deleted, once its lease expired: it
pins the files for one lease term at most, never for ever.

The folder's name starts with ``_``: Delta readers and delta-rs' vacuum leave
such folders alone. A lease is judged by the storage's clock, never a host's:
a record expired once its modification time (the storage's stamp of its last
renewal) is ``lease_s`` older than the stamp of the vacuum's own record, just
written (``expected_state.vacuum_record``). ``expires`` (the holder's wall
clock) is for people reading the record.

A hold is taken after its version was resolved: a vacuum may have listed the
holds in between. :func:`expected_state.vacuum_record.settle` closes that
window before :meth:`Holding._hold` returns.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field

import pyarrow.fs as pafs  # type: ignore[import-untyped, unused-ignore]
from deltalake import DeltaTable

from expected_state.delta_files import filesystem
from expected_state.vacuum_record import HoldLostError, put, settle
from reconcile.core import hooks

__all__ = [
    "DEFAULT_LEASE_S",
    "HOLDS_DIR",
    "HOLD_WRITING",
    "HoldLostError",
    "Holding",
    "held_versions",
    "holds_folder",
]

HOLDS_DIR = "_holds"
# Between a reader resolving a version and writing its hold: the window a vacuum
# may list the holds in (tests/integration/test_store_hold_race.py).
HOLD_WRITING = hooks.declare("expected_state.hold.writing")
# How many times a reader of the newest version resolves it again after a
# vacuum took the one it resolved (each retry reads a version committed since).
_RESOLVE_TRIES = 3
# Two minutes: a killed holder pins its files that long at most, and a live one
# renews every 30 s, so a pause (a GC, a slow disk) of a minute loses nothing.
DEFAULT_LEASE_S = 120.0


@dataclass
class _Scope:
    """One holder's record: its versions, and the thread that renews its lease."""

    uri: str
    name: str
    lease_s: float
    versions: set[int] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None
    written: bool = False  # a record was written (it may hold no version now: one was lost)


def _folder(uri: str) -> tuple[pafs.FileSystem, str]:
    fs, root = filesystem(uri)
    return fs, f"{root.rstrip('/')}/{HOLDS_DIR}"


def holds_folder(uri: str) -> str:
    """The folder of the table's hold records and vacuum records (a filesystem path)."""
    return _folder(uri)[1]


def _write(scope: _Scope) -> None:
    """Write the holder's record, whole or not at all (renewing its lease)."""
    with scope.lock:
        payload = {
            "versions": sorted(scope.versions),
            "lease_s": scope.lease_s,
            "expires": time.time() + scope.lease_s,
            "pid": os.getpid(),
            "host": socket.gethostname(),
        }
        data = json.dumps(payload).encode()
        fs, folder = _folder(scope.uri)
        scope.written = True  # before the write: one that fails may still have landed
        put(fs, folder, f"{folder}/{scope.name}.json", data)


def _renew(scope: _Scope) -> None:
    while not scope.stop.wait(scope.lease_s / 4):
        try:
            _write(scope)
        except OSError:
            # A failed renewal is retried a quarter term later: the lease still
            # runs for three more quarters.
            continue


def held_versions(uri: str, *, now: float | None = None) -> set[int]:
    """The versions of the table at ``uri`` that a live holder holds.

    Args:
        uri: the table.
        now: the storage's time now: the modification time, as the storage
            reports it, of a file the caller has just written (vacuum's own
            record). None: this host's clock (for a caller on the storage's host).

    A record whose lease expired is deleted (its holder was killed, or lost its
    host): housekeeping owes it nothing more. A record that cannot be read (a
    temporary file of a write in progress, a torn object) is skipped.
    """
    fs, folder = _folder(uri)
    infos = fs.get_file_info(pafs.FileSelector(folder, allow_not_found=True))
    moment = time.time() if now is None else now
    held: set[int] = set()
    for info in infos:
        if info.type != pafs.FileType.File or not info.path.endswith(".json"):
            continue
        try:
            with fs.open_input_stream(info.path) as stream:
                record = json.loads(stream.read())
            versions = [int(v) for v in record["versions"]]
            expires = float(record["expires"])
            if "lease_s" in record and info.mtime is not None:
                # WHY: the storage's stamp of the last renewal plus the term, against
                # the storage's "now": a holder's skewed wall clock plays no part.
                expires = info.mtime.timestamp() + float(record["lease_s"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if expires < moment:
            # WHY: an expired lease means the holder stopped renewing it (killed,
            # hung, or its host lost): its versions no longer pin anything.
            with suppress(OSError):
                fs.delete_file(info.path)
            continue
        held.update(versions)
    return held


class Holding:
    """Mixin for :class:`~expected_state.store.ExpectedStateStore`: hold the versions read."""

    uri: str
    _hold_scope: _Scope | None = None
    _delta: Callable[..., DeltaTable | None]  # provided by the store

    def _hold_newest(self, table: DeltaTable) -> DeltaTable:
        """Hold the version ``table`` is at; if a vacuum took it first, the newest then.

        Raises:
            HoldLostError: the newest version was lost too, ``_RESOLVE_TRIES`` times.
        """
        for attempt in range(_RESOLVE_TRIES):
            version = table.version()
            try:
                self._hold(version)
                return table
            except HoldLostError:
                # WHY: a version newer than the one resolved exists (that vacuum
                # kept its own newest version): read that one instead, held
                # first. None newer, or no tries left: the error stands.
                fresh = self._delta()
                if fresh is None or fresh.version() <= version or attempt + 1 == _RESOLVE_TRIES:
                    raise
                table = fresh
        raise AssertionError("unreachable")

    @contextmanager
    def holding(self, *, lease_s: float = DEFAULT_LEASE_S) -> Iterator[None]:
        """Within this scope, every version this store object reads is held from vacuum.

        Nested scopes share the outer one. The record is deleted when the
        outermost scope ends, however it ends.
        """
        if self._hold_scope is not None:
            yield
            return
        name = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        scope = _Scope(self.uri, name, lease_s)
        self._hold_scope = scope
        try:
            yield
        finally:
            self._hold_scope = None
            scope.stop.set()
            if scope.thread is not None:
                scope.thread.join()
            if scope.written:
                fs, folder = _folder(self.uri)
                # Gone already, or unreachable: the lease ends it then.
                with suppress(OSError):
                    fs.delete_file(f"{folder}/{scope.name}.json")

    def _hold(self, version: int) -> None:
        """Hold ``version`` (a no-op outside :meth:`holding`): before its files are read.

        Raises:
            HoldLostError: a vacuum that missed the hold took files or log
                entries of ``version`` (resolve a newer one).
        """
        scope = self._hold_scope
        if scope is None or version in scope.versions:
            return
        hooks.point(HOLD_WRITING)
        with scope.lock:
            scope.versions.add(version)
        _write(scope)
        folder = holds_folder(self.uri)
        try:
            settle(self.uri, version, folder, f"{folder}/{scope.name}.json", lambda: _write(scope))
        except HoldLostError:
            # WHY: not held, so that a later read of it checks again (and fails the same).
            with scope.lock:
                scope.versions.discard(version)
            raise
        if scope.thread is None:
            scope.thread = threading.Thread(
                target=_renew, args=(scope,), name="reconcile-store-hold", daemon=True
            )
            scope.thread.start()
