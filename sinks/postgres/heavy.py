"""Heavy sessions: what every pull, checksum and repair session sets, and cancelling its work.

A heavy session runs statements whose cost follows a table rather than an
epoch: recovery's pulls (ADBC COPY) and checksum queries, a repair, and the
sink's own epoch sessions (a large epoch's COPY). Every one of them gets its
settings from ``settings_sql`` here, in one round trip, so that none depends on
what the server, database or role happens to set:

- ``jit = off``. JIT compiles a query's expressions with LLVM before it runs
  them; a compile does not look at interrupts, so a backend compiling a large
  expression ignores ``pg_cancel_backend``, ``pg_terminate_backend`` and
  ``statement_timeout`` alike. These queries are shaped to need no JIT (their
  text does not grow with the data), and a scan's checksum gains little from it.
- ``statement_timeout``: the value the caller gives (the sink's
  ``statement_timeout_ms``), else the server's, database's or role's non-zero
  setting, else ``DEFAULT_STATEMENT_TIMEOUT_MS``. The server enforces it, so a
  statement whose client is gone for good ends at the latest then.
- ``client_connection_check_interval`` (PostgreSQL 14+; skipped where the
  server lacks it): while a statement runs, the server polls the client's
  socket at this interval and ends the statement when the client is gone. A
  backend otherwise notices a dead client only when it next writes to it, and
  an aggregate (a bucket checksum) or a lock wait writes nothing until it ends.
- ``tcp_keepalives_idle``, ``_interval``, ``_count``: the same over TCP when the
  client's host vanished without closing the socket (no effect on a Unix socket).

``hand_over`` overlaps a pull's two halves: the driver decoding the COPY
stream (C code, without the GIL) and the work on each batch it decoded (conform
and hash, mostly numpy).

``Cancellable`` runs a session's statements so that the client's interruption
cancels the server's work: the statement runs in a worker thread while the
caller's thread waits, so a signal (SIGINT's KeyboardInterrupt, a SIGTERM
handler that raises) or any exception reaches the waiting thread at once, even
during a long C call in the driver; it then sends the server a cancel request
and lets the session be closed. A client killed outright (SIGKILL) sends
nothing: the check interval above ends its statement.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import TypeVar

from psycopg import sql

__all__ = [
    "CANCEL_WAIT_S",
    "CLIENT_CHECK_INTERVAL_MS",
    "DEFAULT_STATEMENT_TIMEOUT_MS",
    "FIXED_SETTINGS",
    "Cancellable",
    "hand_over",
    "settings_sql",
]

log = logging.getLogger("reconcile.sinks.postgres")

T = TypeVar("T")

# A statement of a heavy session that runs longer is ended by the server. 15
# minutes: far above what one statement of a sink or of recovery needs (a full
# pull reads about a million rows a second; an epoch's COPY, at the slowest
# measured rate, 140k rows a second, would be over 100 million rows).
DEFAULT_STATEMENT_TIMEOUT_MS = 15 * 60_000
# How often a running statement checks that its client is still there: a
# backend outlives a killed client by about this much (one poll() each time).
CLIENT_CHECK_INTERVAL_MS = 1_000
# Set on every heavy session, whatever the server's own values.
FIXED_SETTINGS: dict[str, str] = {
    "jit": "off",
    "client_connection_check_interval": str(CLIENT_CHECK_INTERVAL_MS),
    "tcp_keepalives_idle": "30",
    "tcp_keepalives_interval": "10",
    "tcp_keepalives_count": "3",
}
# How long an interrupted statement is waited for after its cancel was sent.
CANCEL_WAIT_S = 10.0


def settings_sql(
    explicit: Mapping[str, int | None], fallback: Mapping[str, int] | None = None
) -> str:
    """One statement that sets a heavy session's settings (``FIXED_SETTINGS`` included).

    Values are literals (they are integers and the fixed strings above), so
    the same text runs on psycopg and on ADBC. It returns one row per setting
    it set.

    Args:
        explicit: settings the caller chose; None leaves the setting to
            ``fallback``, 0 disables a timeout (as in PostgreSQL).
        fallback: values for settings that ``explicit`` leaves at None, applied
            only where the session's value (from the server, database or role)
            is 0, i.e. disabled: a DBA's choice stands.
    """
    fallback = dict(fallback or {})
    rows: list[tuple[str, str | None, str | None]] = [
        (name, value, None) for name, value in FIXED_SETTINGS.items()
    ]
    for name in sorted(set(explicit) | set(fallback)):
        given = explicit.get(name)
        rows.append(
            (
                name,
                None if given is None else str(int(given)),
                None if name not in fallback else str(int(fallback[name])),
            )
        )
    values = sql.SQL(", ").join(
        sql.SQL("({}, {}::text, {}::text)").format(
            sql.Literal(name), sql.Literal(value), sql.Literal(default)
        )
        for name, value, default in rows
    )
    # A setting this server does not know (client_connection_check_interval
    # before PostgreSQL 14) is skipped rather than refused.
    query = sql.SQL(
        "SELECT pg_catalog.set_config(s.name, COALESCE(s.explicit, s.fallback), false) "
        "FROM (VALUES {}) AS s(name, explicit, fallback) "
        "WHERE s.name IN (SELECT p.name FROM pg_catalog.pg_settings p) "
        "AND (s.explicit IS NOT NULL OR (s.fallback IS NOT NULL "
        "AND pg_catalog.current_setting(s.name) = '0'))"
    ).format(values)
    return query.as_string(None)


class Cancellable:
    """Runs one session's statements so that interrupting the client cancels them on the server.

    Args:
        what: the session, for the log line when a statement does not end
            after its cancel.
    """

    def __init__(self, what: str) -> None:
        self.what = what
        # A statement that did not end after its cancel still runs in its
        # worker: the session must not be closed under it (the caller leaves
        # the connection to the server's checks and the process's exit).
        self.stuck = False

    def run(self, call: Callable[[], T], cancel: Callable[[], object]) -> T:
        """``call()`` in a worker thread; on any interruption, ``cancel()`` and re-raise.

        Args:
            call: runs the statement and reads its result.
            cancel: asks the server to cancel it (psycopg's ``cancel_safe``,
                ADBC's ``adbc_cancel``); thread-safe by both drivers' contracts.

        Raises:
            Whatever ``call`` raised, or what interrupted the wait (then after
            the cancel was sent and the statement ended, or ``CANCEL_WAIT_S``).
        """
        result: list[T] = []
        failure: list[BaseException] = []
        done = threading.Event()

        def work() -> None:
            try:
                result.append(call())
            except BaseException as err:  # handed to the waiting thread
                failure.append(err)
            finally:
                done.set()

        threading.Thread(target=work, name="reconcile-statement", daemon=True).start()
        try:
            # A lock wait is interrupted by signals on POSIX: a handler that
            # raises (KeyboardInterrupt, a SIGTERM handler) raises here.
            done.wait()
        except BaseException:
            self._cancel(cancel, done)
            raise
        if failure:
            raise failure[0]
        return result[0]

    def _cancel(self, cancel: Callable[[], object], done: threading.Event) -> None:
        # The cancel request opens a connection of its own; it runs in a thread
        # too, so that a server that cannot be reached delays the exit by
        # CANCEL_WAIT_S at most.
        def send() -> None:
            try:
                cancel()
            except Exception as err:  # the interruption is what the caller sees
                log.warning("cancel of a statement of %s failed: %s", self.what, err)

        threading.Thread(target=send, name="reconcile-cancel", daemon=True).start()
        try:
            ended = done.wait(CANCEL_WAIT_S)
        except BaseException:
            # Interrupted again while waiting: the statement may still run.
            self.stuck = True
            raise
        if not ended:
            self.stuck = True
            log.warning(
                "a statement of %s did not end within %.0fs of its cancel; its session is "
                "left to the server's client checks",
                self.what,
                CANCEL_WAIT_S,
            )


def hand_over(batches: Iterable[T], each: Callable[[T], None]) -> None:
    """``each(batch)`` for every batch, in order, on a second thread, while this one reads on.

    The read (a driver decoding a COPY) and the work on the batch before it then
    run at once; on two cores a full verify's pull took about a sixth less time.
    One batch waits between them, so at most three batches are held (the one
    read, the one waiting, the one worked on), where an inline loop holds one.
    ``each`` runs on one thread, so it needs no lock; the batches are read on
    this thread only, so a cursor is never used from two threads.

    Raises:
        What ``each`` raised (no batch is read after it), or what the read
        raised (once the batch being worked on is done); the read's, if both.
    """
    handed: queue.Queue[tuple[T] | None] = queue.Queue(maxsize=1)
    failed: list[BaseException] = []

    def work() -> None:
        # Drains to the end even after a failure, so the reader never waits on a
        # full queue that nobody empties.
        while (item := handed.get()) is not None:
            if not failed:
                try:
                    each(item[0])
                except BaseException as err:  # raised on the reading thread
                    failed.append(err)

    worker = threading.Thread(target=work, name="reconcile-batches", daemon=True)
    worker.start()
    try:
        for batch in batches:
            if failed:
                break
            handed.put((batch,))
    finally:
        handed.put(None)
        worker.join()
    if failed:
        raise failed[0]
