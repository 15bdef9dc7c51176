"""What a new leader does before its stream starts: fence the old writer everywhere, then converge.

1. ``terminate_old_sessions``: end the sink sessions of the pipeline's
   earlier writer. A main that is paused (SIGSTOP, a long GC) in the middle of
   an epoch keeps its transaction open, and with it the row lock on its sink
   fence; the new writer would wait for that lock until the old session died.
   Terminating it rolls the open transaction back, which loses nothing: an
   epoch that passed its decision is in the store, and step 3 puts it in the
   sink. Only sessions of the sink's own role are ended: another role that
   names its sessions like ours is ignored.
2. ``start_fenced``: build the cycle and ``start()`` it, which claims a new
   writer generation (the store's fence) after a check that the lease is
   still held, then raise every sink's fence to that generation at once
   (``fence_sinks``), not at the first epoch: from here on the old main is
   rejected inside its own transaction, in every sink and in the store. A
   fence row that stays locked is tried again after a backoff (then the
   takeover fails as Retryable); a role that may not write it is a
   ConfigurationError.
3. ``recover_sinks``: scoped pull-and-diff of every sink table that has an
   expected state, to the newest decided epoch, as the new generation.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

import psycopg

from reconcile.core.contract import (
    ConfigurationError,
    FencedError,
    RetryableError,
    WriterIdentity,
)
from reconcile.core.lease import Lease
from reconcile.core.progress import ProgressLog
from reconcile.core.sink import capabilities_of
from reconcile.engine.cycle import CommitCycle
from reconcile.recovery.api import recover_sink
from reconcile.recovery.modes import Mode

__all__ = [
    "LeadershipLostError",
    "fence_sinks",
    "guard_claims",
    "recover_sinks",
    "terminate_old_sessions",
]

log = logging.getLogger("reconcile.ha")

FENCE_ATTEMPTS = 3  # tries of one sink's fence whose row stays locked, at takeover
FENCE_BACKOFF_S = 0.5  # the first wait between them; it doubles


class SessionTarget(Protocol):
    """A sink's database as the takeover reaches it (a Postgres sink's ``target``)."""

    def describe(self) -> str:
        """``user@host:port/dbname``: safe to log."""
        ...

    def redact(self, text: str) -> str:
        """``text`` without the connection's secrets."""
        ...

    def connect(self, *, autocommit: bool = False, **overrides: Any) -> psycopg.Connection[Any]:
        """A new connection to the database."""
        ...


class LeadershipLostError(FencedError):
    """This instance no longer holds the pipeline's lease: it must not claim a generation."""


class _LeasedProgress:
    """A progress log whose ``claim_generation`` needs the lease, before and after the claim.

    The check before stops a standby that lost its lease from claiming. The
    check after (a renewal, in the database) catches a holder that was
    paused between the first check and its claim: its claim may have landed
    after a newer leader's and fenced it, but it raises here and never
    writes, and the newer leader, fenced, claims again (``HaNode``).
    """

    def __init__(self, inner: ProgressLog, lease: Lease) -> None:
        self._inner, self._lease = inner, lease

    def claim_generation(self) -> int:
        if not self._lease.held():
            raise LeadershipLostError(
                f"pipeline {self._lease.pipeline!r}: {self._lease.holder} does not hold the "
                "lease: no generation claimed"
            )
        generation = self._inner.claim_generation()
        if not self._lease.renew():
            raise LeadershipLostError(
                f"pipeline {self._lease.pipeline!r}: {self._lease.holder} lost the lease while "
                f"claiming generation {generation}: stepping down without writing"
            )
        return generation

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def guard_claims(build: Callable[[], CommitCycle], lease: Lease) -> Callable[[], CommitCycle]:
    """``build``, with every cycle's generation claims checked against ``lease``."""

    def leased() -> CommitCycle:
        cycle = build()
        cycle.progress = _LeasedProgress(cycle.progress, lease)
        return cycle

    return leased


def terminate_old_sessions(cycle: CommitCycle, *, wait_ms: int = 5000) -> int:
    """End every session of this pipeline's sinks in their databases; how many were ended.

    Sessions are found by the application_name every sink session of the
    pipeline carries (``reconcile:<pipeline>:<sink>``, the executors' staging
    sessions too) AND by their role, which must be the sink's own
    (``current_user``): any role that can connect can name a session like
    ours, and ending it is neither ours to do nor possible (Postgres refuses
    it). Each session is ended in a statement of its own, so that one that
    cannot be ended (gone meanwhile, refused) does not spare the others.
    Call it before this process opens sessions of its own for these sinks.
    A sink of another SQL backend ends its own (``end_writer_sessions``: the
    writer's marked sessions, each in a try of its own). A sink without
    sessions (files, Delta, HTTP) has none to end: its fence alone stops the
    old writer.
    """
    prefix = f"reconcile:{cycle.pipeline}:"
    ended = 0
    seen: set[str] = set()
    for name, sink in cycle.sinks.items():
        end_own = getattr(sink, "end_writer_sessions", None)
        if callable(end_own):
            try:
                ended += int(end_own(WriterIdentity(cycle.pipeline, cycle.progress.log_id)))
            except Exception as exc:  # one sink's failure must not spare the others' sessions
                # Not fatal: the fence still rejects the old writer (see above).
                log.warning("takeover: could not end old sessions of sink %s: %r", name, exc)
            continue
        target = getattr(sink, "target", None)
        if target is None or not hasattr(target, "connect") or target.describe() in seen:
            continue
        seen.add(target.describe())
        try:
            with target.connect(autocommit=True, application_name="reconcile-takeover") as conn:
                ended += _end_sessions(conn, target, prefix, wait_ms)
        except psycopg.Error as exc:
            # Not fatal: the fence still rejects the old writer; only the lock
            # wait of fence_sinks() may then take longer.
            log.warning("takeover: could not end old sessions of pipeline %s at %s: %s",
                        cycle.pipeline, target.describe(), target.redact(str(exc)))  # fmt: skip
    return ended


def _end_sessions(
    conn: psycopg.Connection[Any], target: SessionTarget, prefix: str, wait_ms: int
) -> int:
    """End the sessions of our role named ``prefix...`` on ``conn``'s database; how many ended."""
    # The pids first, then one termination each: in a single statement the
    # planner may call pg_terminate_backend() on a row before the filters have
    # ruled it out.
    pids = [row[0] for row in conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
        "AND pid <> pg_backend_pid() AND usename = current_user "
        "AND left(application_name, %s) = %s",
        (len(prefix), prefix),
    ).fetchall()]  # fmt: skip
    ended = 0
    for pid in pids:
        try:
            done = conn.execute("SELECT pg_terminate_backend(%s, %s)", (pid, wait_ms)).fetchone()
        except psycopg.Error as exc:
            # Autocommit: a refused statement leaves the connection usable for the next pid.
            log.warning("takeover: could not end session %d at %s: %s", pid, target.describe(),
                        target.redact(str(exc)))  # fmt: skip
            continue
        ended += 1 if done and done[0] else 0
    if ended:
        log.info("takeover: ended %d old session(s) named %s* at %s", ended, prefix,
                 target.describe())  # fmt: skip
    return ended


def fence_sinks(
    cycle: CommitCycle, *, attempts: int = FENCE_ATTEMPTS, lock_timeout_ms: int | None = None
) -> list[str]:
    """Raise every sink's fence to the cycle's generation now; the sinks fenced this way.

    A sink without an eager ``fence`` is fenced at its first epoch, inside
    that epoch's transaction. A fence row locked by a session that was not
    ended (its lock wait runs out: 55P03) is tried again after a backoff, up
    to ``attempts`` times, as the same generation. ``lock_timeout_ms``: how
    long each try waits for the row (default: the sink's).

    Raises:
        FencedError: a newer generation holds a sink's fence (we lost).
        ConfigurationError: the sink's role may not write the fence (42501):
            no retry can cure it; the message names the sink.
        RetryableError: the fence row stayed locked, or the database did not
            answer; the takeover may be tried again.
    """
    generation = cycle.generation
    assert generation is not None, "fence_sinks() after start()"
    fenced = []
    for name, sink in cycle.sinks.items():
        fence = getattr(sink, "fence", None)
        if callable(fence):
            if lock_timeout_ms is not None:
                fence = functools.partial(fence, lock_timeout_ms=lock_timeout_ms)
            _fence_one(cycle.pipeline, name, sink, fence, generation, attempts)
            fenced.append(name)
    return fenced


def _fence_one(
    pipeline: str,
    name: str,
    sink: object,
    fence: Callable[[str, int], object],
    generation: int,
    attempts: int,
) -> None:
    """One sink's fence, with the lock-wait retries of ``fence_sinks``."""
    target: SessionTarget | None = getattr(sink, "target", None)

    def redact(text: str) -> str:
        return str(target.redact(text)) if target is not None else text

    for attempt in range(1, attempts + 1):
        try:
            fence(pipeline, generation)
            return
        except psycopg.errors.InsufficientPrivilege as exc:
            raise ConfigurationError(
                f"pipeline {pipeline!r}: sink {name!r}: cannot raise its fence to generation "
                f"{generation}: {redact(str(exc).strip().splitlines()[0])} (grant the sink's "
                "role what it needs on its state tables); no retry can help",
                sink=name,
            ) from None
        except psycopg.Error as exc:
            said = redact(str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc))
            if attempt == attempts:
                raise RetryableError(
                    f"pipeline {pipeline!r}: sink {name!r}: could not raise its fence to "
                    f"generation {generation} in {attempts} attempts: {said}",
                    sink=name,
                ) from None
            # A lock held by a session the takeover could not end (55P03), or
            # no answer: wait, then try again as the same generation.
            wait = FENCE_BACKOFF_S * 2 ** (attempt - 1)
            log.warning("takeover: fence of sink %s not raised (%s); again in %.1fs", name,
                        said, wait)  # fmt: skip
            time.sleep(wait)


def recover_sinks(cycle: CommitCycle) -> dict[str, int]:
    """Scoped pull-and-diff of every sink with an expected state; rows applied per sink.

    The target is the newest decided epoch. An epoch the old main decided
    but never committed into a sink (killed between the store commit and the
    sink commit) is applied here, once, from the rows the store recorded.
    """

    generation, expected = cycle.generation, cycle.expected_state
    assert generation is not None, "recover_sinks() after start()"
    target = cycle.progress.last_committed()
    applied: dict[str, int] = {}
    if expected is None or target is None:
        return applied
    stores = expected.tables

    def recover_one(name: str) -> int:
        found = recover_sink(cycle.sinks[name], stores[name], generation, mode=Mode.AUTO,
                             after_crash=True, target_epoch=target)  # fmt: skip
        log.info("takeover: sink %s at epoch %d (%s mode): %d missing, %d extra, %d changed, "
                 "%d applied", name, target, found.mode, found.missing, found.extra,
                 found.changed, found.applied)  # fmt: skip
        return found.applied

    names = sorted(n for n, sink in cycle.sinks.items()
                   if n in stores and capabilities_of(sink).pullable)  # fmt: skip
    if not names:
        return applied
    # One thread per sink: each has its own connection and store table, and
    # the takeover waits for the slowest, not the sum (it is on the clock).
    with ThreadPoolExecutor(len(names), thread_name_prefix="takeover-recover") as pool:
        futures = {name: pool.submit(recover_one, name) for name in names}
        for name, future in futures.items():
            applied[name] = future.result()
    return applied
