"""A pipeline's leadership lease: one row in a Postgres table, its term in the database's clock.

Why a row and not an advisory lock: an advisory lock lives as long as the
session that took it. A main stopped by SIGSTOP (or a long GC pause, or cut
off behind a half-open TCP connection) keeps its session open, so its lock
would outlive it by as long as TCP keepalive takes to give up, minutes, and no
standby could take over in seconds. A row whose ``expires_at`` is set in the
database's own clock runs out on its own: every instance sees the same
expiry, whatever its host's clock says, no session has to stay open, and it
works through a transaction-pooling PgBouncer. The row sits in the sink
database, which every instance must reach anyway.

A holder that died is not waited for: the row keeps the server pid of the
holder's lease session (``backend_pid``). A process that is killed closes
its sockets, and Postgres ends its sessions at once; a paused one keeps
them. So a lease whose holder's session is gone and that was not renewed for
half a term (a holder whose connection merely dropped reconnects and renews
within a quarter term) is free at once, without waiting for the term to
run out. A host that vanishes without closing its sockets keeps its sessions
until TCP gives up: its lease runs out as usual.

The lease only says who *should* write. Safety does not rest on it: the
writer generation, checked inside every sink transaction and every store
commit, rejects a stale writer that still believes it leads (see
``reconcile.ha.node``).

Table (declared, created on first use and checked on every connection by
``sinks.objects``)::

    reconcile.reconcile_leases(pipeline text PRIMARY KEY, holder text,
                               tenure bigint, acquired_at, renewed_at,
                               expires_at timestamptz, backend_pid int)

``tenure`` counts the changes of holder: it goes up by one at every takeover.

The table is in the engine's schema (``reconcile`` unless ``schema=``), named
with its schema, and refused before any statement runs on it unless it is the
lease role's own with exactly that definition, no triggers, rules or
row-level security, and no grant to another role, in a schema no other role
may use: a table another role planted could run its code as this role on
every renewal, or hold a lease that no instance can ever take.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Final, LiteralString

import psycopg
from psycopg import sql

from reconcile.core.contract import ConfigurationError, RetryableError, validate_name
from reconcile.core.lease import DEFAULT_TERM_S, LeaseState, default_holder
from sinks.objects.declared import ENGINE_SCHEMA
from sinks.objects.postgres import open_lease_table
from sinks.postgres.connection import PgTarget

__all__ = ["MAX_TERM_S", "PgLease"]

# The longest term: half of it is every lease statement's timeout, which
# PostgreSQL takes in milliseconds up to 2**31 - 1 (24.8 days); 30 days leaves
# room. An infinite term (``inf`` is a TOML float) would never run out.
MAX_TERM_S = 30 * 86400.0


# The upsert that takes the lease, before the condition of taking it (try_acquire's,
# or none for preempt), and what it returns.
_UPSERT: Final = (
    "INSERT INTO {t} AS l (pipeline, holder, tenure, acquired_at, renewed_at, "
    "expires_at, backend_pid) VALUES (%(p)s, %(h)s, 1, clock_timestamp(), "
    "clock_timestamp(), clock_timestamp() + make_interval(secs => %(term)s), "
    "pg_backend_pid()) "
    "ON CONFLICT (pipeline) DO UPDATE SET holder = excluded.holder, "
    "tenure = CASE WHEN l.holder = excluded.holder AND l.expires_at > "
    "clock_timestamp() THEN l.tenure ELSE l.tenure + 1 END, "
    "acquired_at = CASE WHEN l.holder = excluded.holder AND l.expires_at > "
    "clock_timestamp() THEN l.acquired_at ELSE clock_timestamp() END, "
    "renewed_at = clock_timestamp(), expires_at = excluded.expires_at, "
    "backend_pid = excluded.backend_pid "
)
_RETURNING: Final = (
    "RETURNING pipeline, holder, tenure, expires_at, "
    "extract(epoch FROM expires_at - clock_timestamp())"
)


class PgLease:
    """The lease of ``pipeline`` in the Postgres database at ``dsn``.

    Args:
        dsn: a libpq DSN or URL (usually the sink database's).
        pipeline: the pipeline's name.
        term_s: how long a taken or renewed lease lasts (default 2 s), more
            than 0 and at most ``MAX_TERM_S`` (30 days). The holder renews it
            every ``term_s / 4``.
        holder: this instance's name in the row (default host:pid:random).
        schema: the schema of the lease table (default ``reconcile``, the
            engine's; created if missing).
        owner: another role trusted to own the lease table and its schema
            (by default only the connection's role is).

    One connection (autocommit) is kept open and re-opened after an error.
    Every statement has a timeout of half a term, so a slow database cannot
    make a holder believe it still leads. Every new connection checks the
    table first.

    Errors: a database that cannot be reached or answers late is a
    RetryableError (try again); a lease table that cannot be created (the role
    lacks CREATE), is refused by the check, or is denied to the role is a
    ConfigurationError, which no retry mends: the caller stops.
    """

    def __init__(
        self,
        dsn: str | PgTarget,
        pipeline: str,
        *,
        term_s: float = DEFAULT_TERM_S,
        holder: str | None = None,
        schema: str | None = None,
        owner: str | None = None,
    ) -> None:
        if not 0 < term_s <= MAX_TERM_S:  # NaN fails both
            raise ConfigurationError(
                f"lease term must be > 0 seconds and at most {MAX_TERM_S:.0f} (30 days), "
                f"got {term_s!r}"
            )
        self.target = PgTarget.parse(dsn)
        self.pipeline = validate_name("pipeline", pipeline)
        self.term_s = float(term_s)
        self.holder = holder or default_holder()
        self.schema = schema if schema is not None else ENGINE_SCHEMA
        self.owner = owner
        self._table: sql.Identifier | None = None  # schema-qualified, once checked
        self._conn: psycopg.Connection[Any] | None = None
        self._lock = threading.Lock()  # one statement at a time on the connection
        self._tenure: int | None = None
        self._valid_until = 0.0  # time.monotonic() up to which we surely hold it

    # -- what we know locally ------------------------------------------------

    @property
    def tenure(self) -> int | None:
        """The tenure we hold (None: we do not hold the lease)."""
        return self._tenure

    @property
    def held_until(self) -> float:
        """The ``time.monotonic()`` up to which ``held()`` says yes (its tenure aside)."""
        return self._valid_until

    def held(self) -> bool:
        """Whether we surely still hold the lease, by this process's own clock.

        The term is counted from *before* the statement that took or renewed
        it was sent, so this errs towards "no": a process that was paused
        past its term (the monotonic clock runs on while it is stopped) knows
        it lost the lease without asking anyone.
        """
        return self._tenure is not None and time.monotonic() < self._valid_until

    # -- statements ------------------------------------------------------------

    def try_acquire(self) -> LeaseState | None:
        """Take the lease if it is free, expired, its holder is gone, or ours; None if not.

        A new holder gets the next tenure; taking our own live lease again
        keeps it. Of two instances racing for an expired lease exactly one
        wins: the row is locked by the upsert, and the loser's condition is
        checked again on the winner's row, which has not expired.
        """
        return self._take(
            "WHERE l.expires_at <= clock_timestamp() OR l.holder = excluded.holder "
            "OR (l.renewed_at < clock_timestamp() - make_interval(secs => %(grace)s) "
            "AND l.backend_pid IS NOT NULL "
            "AND NOT EXISTS (SELECT FROM pg_stat_activity a WHERE a.pid = l.backend_pid)) "
        )

    def preempt(self) -> LeaseState:
        """Take the lease now, from whoever holds it (a rebuild makes the pipeline step aside).

        The holder's next renewal finds the row no longer its own and steps
        down (its held() runs out within a term on its own clock); a standby
        finds it held and waits. The holder's writes are stopped by the
        generation the preempting instance claims next, not by this row.
        """
        state = self._take("")
        assert state is not None  # an upsert without a WHERE always returns its row
        return state

    def _take(self, when: LiteralString) -> LeaseState | None:
        """The lease upserted as ours where the row is absent or ``when`` holds on it.

        A new holder gets the next tenure; taking our own live lease again keeps it.
        """
        row, sent = self._timed(
            sql.SQL(_UPSERT + when + _RETURNING),
            {"p": self.pipeline, "h": self.holder, "term": self.term_s, "grace": self.term_s / 2},
        )
        if row is None:
            self._tenure = None
            return None
        state = _state(row)
        self._tenure, self._valid_until = state.tenure, sent + self.term_s
        return state

    def renew(self) -> bool:
        """Extend our lease by a term; False if it is no longer ours (then we do not hold it).

        A lease that ran out is not renewed even if nobody took it: the
        holder was away for longer than its term and must take it anew.
        """
        if self._tenure is None:
            return False
        row, sent = self._timed(
            sql.SQL(
                "UPDATE {t} SET renewed_at = clock_timestamp(), expires_at = "
                "clock_timestamp() + make_interval(secs => %(term)s), "
                "backend_pid = pg_backend_pid() WHERE pipeline = %(p)s "
                "AND holder = %(h)s AND tenure = %(n)s AND expires_at > clock_timestamp() "
                "RETURNING pipeline, holder, tenure, expires_at, "
                "extract(epoch FROM expires_at - clock_timestamp())"
            ),
            {"p": self.pipeline, "h": self.holder, "n": self._tenure, "term": self.term_s},
        )
        if row is None:
            self._tenure = None
            return False
        self._valid_until = sent + self.term_s
        return True

    def release(self) -> None:
        """Give the lease up now (a clean stop or a step-down), so a standby need not wait."""
        tenure, self._tenure = self._tenure, None
        if tenure is None:
            return
        self._one(
            sql.SQL(
                "UPDATE {t} SET expires_at = clock_timestamp() WHERE pipeline = %(p)s AND "
                "holder = %(h)s AND tenure = %(n)s RETURNING pipeline"
            ),
            {"p": self.pipeline, "h": self.holder, "n": tenure},
        )

    def release_locally(self) -> None:
        """Forget the lease without a statement (it was lost; somebody else may hold it now)."""
        self._tenure = None

    def current(self) -> LeaseState | None:
        """The lease row (whoever holds it), or None if the pipeline never had one."""
        row = self._one(
            sql.SQL(
                "SELECT pipeline, holder, tenure, expires_at, "
                "extract(epoch FROM expires_at - clock_timestamp()) FROM {t} "
                "WHERE pipeline = %(p)s"
            ),
            {"p": self.pipeline},
        )
        return _state(row) if row is not None else None

    def close(self) -> None:
        """Close the connection (the lease itself stays until released or expired)."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    # -- plumbing --------------------------------------------------------------

    def _one(self, statement: sql.SQL, params: dict[str, Any]) -> tuple[Any, ...] | None:
        """Run one statement on the lease table (``{t}``); its first row (see ``_timed``)."""
        return self._timed(statement, params)[0]

    def _timed(
        self, statement: sql.SQL, params: dict[str, Any]
    ) -> tuple[tuple[Any, ...] | None, float]:
        """Run one statement on the lease table (``{t}``); its first row, and when it was sent.

        The time is taken just before the statement, after a new connection's
        set-up and table check: the database sets ``expires_at`` when it runs
        the statement, later still, so a term counted from it errs towards
        "no longer held".

        Errors close the connection. A privilege error (and the table check's
        refusal) is a ConfigurationError: the role lacks what it needs, and
        a retry meets the same. Every other server error is Retryable.
        """
        with self._lock:
            try:
                conn, table = self._connection()
                with conn.cursor() as cur:
                    sent = time.monotonic()
                    cur.execute(statement.format(t=table), params)
                    return cur.fetchone(), sent
            except psycopg.Error as exc:
                if self._conn is not None:
                    self._conn.close()
                    self._conn = None
                text = (
                    f"lease of pipeline {self.pipeline!r} at {self.target.describe()}: "
                    f"{self.target.redact(str(exc))}"
                )
                if isinstance(exc, psycopg.errors.InsufficientPrivilege):
                    raise ConfigurationError(text, pipeline=self.pipeline) from None
                raise RetryableError(text, pipeline=self.pipeline) from None

    def _connection(self) -> tuple[psycopg.Connection[Any], sql.Identifier]:
        """The open connection and the checked table (a new connection checks it first)."""
        if self._conn is None or self._conn.closed or self._table is None:
            timeout_ms = max(100, int(self.term_s * 500))
            conn = self.target.connect(
                autocommit=True,
                application_name=f"reconcile-lease:{self.pipeline}"[:63],
                connect_timeout=str(max(1, round(self.term_s))),
                options=f"-c statement_timeout={timeout_ms} -c lock_timeout={timeout_ms}",
            )
            try:
                what = f"lease of pipeline {self.pipeline!r} at {self.target.describe()}"
                self._table = open_lease_table(conn, self.schema, owner=self.owner, what=what)
            except BaseException:
                conn.close()
                raise
            self._conn = conn
        return self._conn, self._table


def _state(row: tuple[Any, ...]) -> LeaseState:
    pipeline, holder, tenure, expires_at, remaining = row
    return LeaseState(str(pipeline), str(holder), int(tenure), expires_at, float(remaining))
