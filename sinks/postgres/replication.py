"""Durability under synchronous replication: bounded COMMITs, and confirming what they left open.

What the engine promises: an epoch is reported committed (OK, and so
finalized by the cycle) only once the server has made its commit as durable
as its configuration asks, on the primary and, when ``synchronous_standby_names``
is set, on the synchronous standbys. Every epoch txn runs with
``synchronous_commit`` at least 'on' (markers.py).

Two things can cut a synchronous-replication wait short and leave a commit
on the primary only, which a failover would lose: a cancel of the COMMIT (the
server answers success, with a WARNING) and the termination of its backend.
So:

- every COMMIT runs under :func:`watched`: a client-side timeout (the server's
  statement_timeout does not cover the replication wait) that cancels it, and
  a record of any WARNING the server sent with it; a COMMIT that was cancelled
  or warned is not taken as done until :func:`confirm_replicated` says so;
- the resolver never terminates a backend that is waiting for replication
  (resolve.py), and confirms every "committed" it finds the same way.

:func:`confirm_replicated` commits a tiny barrier transaction (one logical
WAL message) under the same durability level: its commit record comes after
the epoch's, and standbys receive WAL in order, so once the barrier is
confirmed the epoch is on the standbys too. If it cannot be confirmed in time the outcome is
OutcomeUnknownError: the epoch stays committed-not-finalized in the progress
log, a restart confirms it (or, after a failover that lost it, replays it).
"""

from __future__ import annotations

import contextlib
import itertools
import math
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import errors

from reconcile.core.contract import OutcomeUnknownError

from .markers import SYNC_COMMIT_AT_LEAST_ON

__all__ = ["Watched", "confirm_replicated", "sync_standbys", "watched"]


@dataclass
class Watched:
    """What happened around one COMMIT (or PREPARE / COMMIT PREPARED)."""

    warnings: list[str] = field(default_factory=list)
    cancelled: bool = False

    @property
    def unconfirmed(self) -> bool:
        """True if a replication wait may have been cut short: the commit may be local only."""
        return self.cancelled or bool(self.warnings)


class _Watchdog:
    """One daemon thread that runs each registered action once its deadline passes.

    A thread per COMMIT (threading.Timer) would cost a thread start and join
    on every epoch; here registering and removing a deadline is a dict update
    under a lock, and the thread is woken only for a deadline earlier than the
    one it already waits for.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._due: dict[int, tuple[float, Callable[[], None]]] = {}
        self._keys = itertools.count()
        self._wake_at = math.inf
        self._firing: int | None = None
        self._thread: threading.Thread | None = None

    def add(self, timeout_s: float, action: Callable[[], None]) -> int:
        with self._cond:
            key = next(self._keys)
            deadline = time.monotonic() + timeout_s
            self._due[key] = (deadline, action)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="reconcile-commit-watchdog", daemon=True
                )
                self._thread.start()
            elif deadline < self._wake_at:
                self._cond.notify()
            return key

    def remove(self, key: int) -> None:
        """Forget ``key``; if its action is running right now, wait until it is done."""
        with self._cond:
            self._due.pop(key, None)
            while self._firing == key:
                self._cond.wait()

    def _run(self) -> None:
        with self._cond:
            while True:
                now = time.monotonic()
                for key in [k for k, (d, _) in self._due.items() if d <= now]:
                    _, action = self._due.pop(key)
                    self._firing = key
                    self._cond.release()
                    try:
                        action()
                    except Exception:  # an action reports through its own state
                        pass
                    finally:
                        self._cond.acquire()
                        self._firing = None
                        self._cond.notify_all()
                self._wake_at = min((d for d, _ in self._due.values()), default=math.inf)
                wait = None if self._wake_at == math.inf else max(0.0, self._wake_at - now)
                self._cond.wait(wait)


_WATCHDOG = _Watchdog()


@contextlib.contextmanager
def watched(conn: psycopg.Connection[Any], timeout_s: float | None) -> Iterator[Watched]:
    """Run a commit-like statement with a client-side timeout and WARNING capture.

    After ``timeout_s`` the statement is cancelled (a cancel request on a new
    connection). A cancelled replication wait makes the server answer success
    with a WARNING, so the caller checks :attr:`Watched.unconfirmed`.
    """
    seen = Watched()

    def on_notice(diag: psycopg.errors.Diagnostic) -> None:
        # The severity word is not localized; the message may be.
        if diag.severity_nonlocalized == "WARNING":
            seen.warnings.append(str(diag.message_primary))

    def cancel() -> None:
        seen.cancelled = True
        with contextlib.suppress(Exception):
            conn.cancel_safe(timeout=5.0)

    conn.add_notice_handler(on_notice)
    key = None if timeout_s is None else _WATCHDOG.add(timeout_s, cancel)
    try:
        yield seen
    finally:
        if key is not None:
            _WATCHDOG.remove(key)
        conn.remove_notice_handler(on_notice)


def sync_standbys(conn: psycopg.Connection[Any]) -> str:
    """The server's ``synchronous_standby_names`` ('' when replication is asynchronous)."""
    row = conn.execute("SELECT current_setting('synchronous_standby_names')").fetchone()
    return "" if row is None or row[0] is None else str(row[0])


def confirm_replicated(conn: psycopg.Connection[Any], *, timeout_s: float, what: str) -> None:
    """Return once the synchronous standbys hold everything committed so far on this server.

    Args:
        conn: an idle connection (autocommit or not); it is left idle.
        timeout_s: how long to wait for the standbys.
        what: the epoch's description, for the error.

    Raises:
        OutcomeUnknownError: the standbys did not confirm in time (or the
            connection failed while waiting): the epoch is committed on the
            primary, but a failover could lose it.
    """
    autocommit = conn.autocommit
    try:
        if autocommit:
            conn.autocommit = False
        names = sync_standbys(conn)
        if not names:
            conn.rollback()
            return  # no synchronous standby: the primary's own durability is all there is
        with watched(conn, timeout_s) as seen:
            # The barrier must write WAL of its own: a commit that wrote none
            # (an xid alone) does not wait for the standbys at all.
            conn.execute(
                "SELECT "
                + SYNC_COMMIT_AT_LEAST_ON.format(local="true")
                + ", pg_logical_emit_message(true, 'reconcile', 'replication barrier')"
            )
            conn.commit()
    except errors.InsufficientPrivilege as err:
        raise OutcomeUnknownError(
            f"{what}: committed on the primary, but it cannot be confirmed on the synchronous "
            f"standby: {str(err).strip()}. Grant EXECUTE ON FUNCTION pg_logical_emit_message"
            "(boolean, text, text) to the sink's role (the confirmation commits a WAL message)",
        ) from None
    except psycopg.Error as err:
        raise OutcomeUnknownError(
            f"{what}: committed on the primary, but confirming it on the synchronous "
            f"standby failed ({str(err).strip()}); a failover now could lose it. It is not "
            "reported committed: restart, and the commit is confirmed then (or replayed "
            "after a failover)",
        ) from None
    finally:
        if not conn.closed and not conn.broken:
            with contextlib.suppress(psycopg.Error):
                conn.rollback()
                if conn.autocommit != autocommit:
                    conn.autocommit = autocommit
    if seen.unconfirmed:
        raise OutcomeUnknownError(
            f"{what}: committed on the primary, but the synchronous standby(s) "
            f"({names}) did not confirm it within {timeout_s:.1f}s; a failover now could lose "
            "it. It is not reported committed: restart when the standby is back, and the "
            "commit is confirmed then (or replayed after a failover)",
            standbys=names,
        )
