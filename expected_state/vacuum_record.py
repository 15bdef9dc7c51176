"""The "vacuum running" record, and what a reader does about it after taking a hold.

The race it closes: a reader resolves a store version ``v``, and only then
writes its hold (``expected_state.holds``). A vacuum that listed the holds in
between does not keep ``v``, and may delete files ``v`` references, or prune
its log entries, once the reader thinks ``v`` is safe. The protocol:

Vacuum (:class:`VacuumRunning`):
  1. writes ``<table>/_holds/<host>-<pid>-<token>.vacuum`` (its lease), and
     renews it every quarter of its term while it runs;
  2. only then lists the holds;
  3. deletes, checking before each deletion that its lease is still good by its
     own monotonic clock (:meth:`VacuumRunning.check`), and stops if not;
  4. deletes its record.

Reader (:func:`settle`), after its hold record is written:
  1. lists the vacuum records; each live one may have listed the holds before
     the hold was written, so it waits until each is gone or has expired;
  2. then checks that ``v`` is whole (the log still loads it, every file it
     references exists), and raises :class:`HoldLostError` if not.

Why that suffices (given that a listing shows every object whose write had
completed before it began: a local folder, and S3 since its strong read- and
list-after-write consistency): a vacuum that lists the holds after the hold
was written keeps ``v``. One that listed them before wrote its record before that, so its
record existed before the hold did, and the reader's listing (after its hold)
sees it unless it has ended or expired. Either way, once the reader's wait is
over, no vacuum that missed the hold deletes anything any more: what the check
finds then stays, since every later vacuum sees the hold.

Clock skew: every expiry is judged with the storage's clock only. A record's
last write is its modification time as the filesystem reports it; "now" is the
modification time of a record the judge itself has just written (the reader's
hold, the vacuum's own record). Hosts' wall clocks never meet. What remains is
the storage's clock rate against the vacuum's monotonic clock over one lease
(negligible), and a vacuum process paused for over half its lease between its
:meth:`~VacuumRunning.check` and the deletion that follows.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from contextlib import suppress
from urllib.parse import unquote

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
import pyarrow.fs as pafs  # type: ignore[import-untyped, unused-ignore]
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError, TableNotFoundError

from expected_state.delta_files import filesystem
from reconcile.core.durable import write_atomically
from reconcile.core.errors import InvalidInputError, RetryableError

__all__ = [
    "DEFAULT_VACUUM_LEASE_S",
    "VACUUM_SUFFIX",
    "HoldLostError",
    "VacuumRunning",
    "put",
    "settle",
    "stamp_of",
]

VACUUM_SUFFIX = ".vacuum"
# A minute: a killed vacuum keeps readers waiting that long at most; a live one
# renews every 15 s and stops deleting once 30 s passed without a renewal.
DEFAULT_VACUUM_LEASE_S = 60.0
# How often a waiting reader looks again (and rewrites its hold: a fresh stamp).
_POLL_S = 0.5


class HoldLostError(InvalidInputError):
    """The version a reader holds lost files or log entries to a vacuum before its hold counted."""


def put(fs: pafs.FileSystem, folder: str, path: str, data: bytes) -> None:
    """Write ``path`` whole or not at all: a local atomic rename, an object store's PUT."""
    if isinstance(fs, pafs.LocalFileSystem):
        os.makedirs(folder, exist_ok=True)
        write_atomically(path, data)
    else:
        with fs.open_output_stream(path) as out:
            out.write(data)


def stamp_of(fs: pafs.FileSystem, path: str) -> float:
    """The modification time of ``path`` as the storage reports it (its clock, not ours)."""
    info = fs.get_file_info(path)
    if info.type != pafs.FileType.File or info.mtime is None:
        raise OSError(f"{path}: just written, yet not listed with a modification time")
    return float(info.mtime.timestamp())


def _lease_of(fs: pafs.FileSystem, info: pafs.FileInfo, default: float) -> float:
    try:
        with fs.open_input_stream(info.path) as stream:
            return float(json.loads(stream.read())["lease_s"])
    except (OSError, ValueError, KeyError, TypeError):
        return default  # torn or foreign: judged by the default term, never ignored


def live_vacuums(fs: pafs.FileSystem, folder: str, now: float, *, drop: bool = False) -> list[str]:
    """The vacuum records in ``folder`` whose lease had not run out at storage time ``now``.

    With ``drop``, the records whose lease ran out are deleted (their vacuum
    was killed, or lost its host: it deletes nothing more).
    """
    infos = fs.get_file_info(pafs.FileSelector(folder, allow_not_found=True))
    live = []
    for info in infos:
        if info.type != pafs.FileType.File or not info.path.endswith(VACUUM_SUFFIX):
            continue
        if info.mtime is None:
            live.append(info.path)
            continue
        lease = _lease_of(fs, info, DEFAULT_VACUUM_LEASE_S)
        # WHY: both times are the storage's: its stamp of the vacuum's last
        # renewal, and its stamp of the judge's own write a moment ago.
        if info.mtime.timestamp() + lease >= now:
            live.append(info.path)
        elif drop:
            with suppress(OSError):
                fs.delete_file(info.path)
    return live


class VacuumRunning:
    """A vacuum's record under ``<table>/_holds/``: written first, renewed, deleted last."""

    def __init__(self, uri: str, folder: str, *, lease_s: float = DEFAULT_VACUUM_LEASE_S) -> None:
        self.uri = uri
        self.fs, _ = filesystem(uri)
        self.folder = folder
        self.lease_s = lease_s
        name = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self.path = f"{folder}/{name}{VACUUM_SUFFIX}"
        self.stamp = 0.0  # the storage's time of the first write: "now" for judging holds
        self._renewed = 0.0  # monotonic time the last successful write began
        self._lapsed = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _write(self) -> None:
        began = time.monotonic()
        if self._lapsed or (self._renewed and began - self._renewed > self.lease_s / 2):
            # WHY: paused (or cut off) for over half the lease: readers may have
            # judged the record expired and gone on; a renewal now would not
            # bring that back, so the record stays lapsed and check() refuses.
            self._lapsed = True
            return
        data = json.dumps({"lease_s": self.lease_s, "started": self.stamp or None,
                           "pid": os.getpid(), "host": socket.gethostname()}).encode()  # fmt: skip
        put(self.fs, self.folder, self.path, data)
        self._renewed = began

    def _renew(self) -> None:
        while not self._stop.wait(self.lease_s / 4) and not self._lapsed:
            with suppress(OSError):  # retried a quarter term later; check() stops the deletes
                self._write()

    def __enter__(self) -> VacuumRunning:
        self._write()
        # WHY: before the holds are listed, the record is there for any reader
        # whose hold the listing may miss; its stamp is the storage's "now".
        try:
            self.stamp = stamp_of(self.fs, self.path)
            live_vacuums(self.fs, self.folder, self.stamp, drop=True)
        except BaseException:
            self.__exit__()  # no vacuum follows: readers need not wait for it
            raise
        self._thread = threading.Thread(target=self._renew, name="reconcile-vacuum", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with suppress(OSError):  # unreachable: its lease ends it
            self.fs.delete_file(self.path)

    def check(self) -> None:
        """Before a deletion: raise unless the record was renewed within half its lease.

        A reader judges the record expired a full lease after its last write
        (by the storage's clock, which began no earlier than ``_renewed``): half
        a lease leaves the deletion about to be made the other half to land.

        Raises:
            RetryableError: the lease ran too short; nothing more is deleted.
        """
        since = time.monotonic() - self._renewed
        if self._lapsed or since > self.lease_s / 2:
            self._lapsed = True
            raise RetryableError(
                f"table {self.uri!r}: vacuum stopped: its running record was last renewed "
                f"{since:.1f} s ago (lease {self.lease_s:.0f} s); readers may no longer wait "
                "for it. What it left is deleted by the next vacuum",
                table=self.uri,
            )


def _whole(uri: str, version: int) -> str | None:
    """Why ``version`` of the table cannot be read in full now (None: it can)."""
    try:
        table = DeltaTable(uri, version=version)
    except (TableNotFoundError, DeltaError, OSError) as exc:
        return f"its log entries are gone ({exc})"
    fs, root = filesystem(uri)
    actions = pa.table(table.get_add_actions(flatten=False)).select(["path"])
    paths = [f"{root.rstrip('/')}/{unquote(p)}" for p in actions.column("path").to_pylist()]
    gone = [p for p, info in zip(paths, fs.get_file_info(paths), strict=True)
            if info.type != pafs.FileType.File]  # fmt: skip
    return f"files it references are gone: {gone[:5]}" if gone else None


def settle(uri: str, version: int, folder: str, hold_path: str, renew: Callable[[], None]) -> None:
    """After the hold on ``version`` was written: wait out vacuums that may have missed it.

    Args:
        uri: the table.
        version: the version just held.
        folder: the table's ``_holds`` folder.
        hold_path: the reader's hold record (its modification time is "now").
        renew: a callable that rewrites the hold record (a fresh "now").

    Raises:
        HoldLostError: ``version`` lost files or log entries meanwhile.
    """
    fs, _ = filesystem(uri)
    # WHY: the vacuums seen now are the only ones that may have listed the
    # holds before this hold was written (one that writes its record later
    # lists later, and keeps the version): only these are waited for.
    waiting = set(live_vacuums(fs, folder, stamp_of(fs, hold_path)))
    while waiting:
        time.sleep(_POLL_S)
        renew()  # a fresh storage stamp; a renewal of the hold besides
        waiting &= set(live_vacuums(fs, folder, stamp_of(fs, hold_path)))
    # WHY: no vacuum that missed the hold runs any more; what is whole now
    # stays whole while the hold lasts, and what is not is named, never read.
    why = _whole(uri, version)
    if why is not None:
        raise HoldLostError(
            f"table {uri!r}: version {version} was vacuumed before its hold counted: {why}; "
            "read a newer version (retry)",
            table=uri,
            version=version,
        )
