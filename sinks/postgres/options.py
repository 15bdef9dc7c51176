"""The Postgres sink's options: one frozen value, and the typed keywords that build it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypedDict

__all__ = ["PostgresKeywords", "PostgresOptions"]


@dataclass(frozen=True, slots=True, kw_only=True)
class PostgresOptions:
    """How a Postgres sink client writes its table (both modes).

    Every sink class takes these as keywords (``PostgresSink(dsn, table,
    name=..., key=[...])``, typed by :class:`PostgresKeywords`), and so does a
    config file's sink through ``postgres_sink``; the client keeps them as one
    value, ``client.options``.

    Attributes:
        schema: the target's schema; default the session's current schema.
        key: key columns; default the primary key.
        append_only: the target is keyed by a stable change id and written with
            ON CONFLICT DO NOTHING; deletes are refused.
        state_schema: schema of the engine's tables (markers, fences, repairs,
            the executors' staging tables); default the dedicated schema
            ``reconcile`` (created when missing), or the target's schema where
            an older version put the markers (see ``sinks.objects``).
        state_owner: another role trusted to own the state tables and their
            schema; by default only the sink's own role is.
        create_epoch_column: add an ``_epoch bigint`` column to the target if
            missing (the sink fills ``_epoch`` whenever the column exists).
        statement_timeout_ms: per-statement timeout of the sink's sessions. None:
            the server's (database's, role's) non-zero setting, else 15 min; 0 disables.
        lock_timeout_ms: lock wait limit of the sink's sessions. None: the
            server's non-zero setting, else 60 s; 0 disables.
        idle_in_transaction_timeout_ms: how long an epoch txn may sit open and
            idle (transactional mode, while other sinks prepare). None: the
            server's non-zero setting, else 5 min; 0 disables. Past it the server
            ends the txn and the epoch is replayed, exactly once.
        direct_copy_triggers: let a large Arrow epoch be COPied straight into a
            table that has triggers (COPY fires row triggers, but not statement
            triggers of INSERT ... ON CONFLICT as the normal path does).
        resolve_timeout_s: how long an ambiguous COMMIT is resolved for
            (reconnecting while the server restarts, waiting for synchronous
            standbys) before OutcomeUnknownError.
        commit_timeout_s: client-side limit of a COMMIT (statement_timeout does
            not cover a synchronous-replication wait); None waits forever.
        prepared_warn_after_s: at start-up, warn about the pipeline's prepared
            txns older than this (prepared mode).
    """

    schema: str | None = None
    key: Sequence[str] | None = None
    append_only: bool = False
    state_schema: str | None = None
    state_owner: str | None = None
    create_epoch_column: bool = False
    statement_timeout_ms: int | None = None
    lock_timeout_ms: int | None = None
    idle_in_transaction_timeout_ms: int | None = None
    direct_copy_triggers: bool = False
    resolve_timeout_s: float = 30.0
    commit_timeout_s: float | None = 60.0
    prepared_warn_after_s: float = 3600.0

    @property
    def key_columns(self) -> tuple[str, ...] | None:
        """``key`` as a tuple (None: the primary key)."""
        return None if self.key is None else tuple(self.key)


class PostgresKeywords(TypedDict, total=False):
    """The keywords of :class:`PostgresOptions`, for ``**options`` (see its attributes)."""

    schema: str | None
    key: Sequence[str] | None
    append_only: bool
    state_schema: str | None
    state_owner: str | None
    create_epoch_column: bool
    statement_timeout_ms: int | None
    lock_timeout_ms: int | None
    idle_in_transaction_timeout_ms: int | None
    direct_copy_triggers: bool
    resolve_timeout_s: float
    commit_timeout_s: float | None
    prepared_warn_after_s: float
