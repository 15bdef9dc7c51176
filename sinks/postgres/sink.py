"""The PostgreSQL exactly-once sink, transactional mode: one Postgres transaction per epoch."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import errors, sql

from reconcile.contract import (
    OK,
    ConfigurationError,
    Fatal,
    FencedError,
    InvalidInputError,
    Retryable,
    SinkOutcome,
    SinkTxnId,
    validate_name,
)

from .apply import apply_with_copy
from .connection import PgTarget
from .markers import StateTables
from .resolve import InFlightTxn, Resolution, resolve_commit
from .schema import EPOCH_COLUMN, TableSchema, reflect_table
from .session import Session, SessionSlot, classify_failure, describe_failure
from .staging import EpochBatch, ValidatedBatch, validate_batch

__all__ = ["PostgresSink"]

log = logging.getLogger("reconcile.sinks.postgres")

Key = tuple[str, str, int]


@dataclass
class _OpenTxn:
    """An epoch txn that prepare() left open, waiting for commit()."""

    txn_id: SinkTxnId
    session: Session | None  # None: the epoch was already committed (marker found)
    xid: str = ""


class PostgresSink:
    """Exactly-once sink into one PostgreSQL table, one transaction per epoch.

    ``prepare`` runs BEGIN, records ``pg_current_xact_id()`` and the backend
    pid, checks the writer fence (row locked FOR UPDATE), COPYs the batch into
    a temp table, upserts / deletes in bulk and inserts the marker, and leaves
    the transaction open. ``commit`` runs COMMIT; if no reply arrives, the
    outcome is asked from the database (see ``resolve.py``).

    Honest limit of this mode: without PREPARE TRANSACTION nothing can be
    durable but invisible, so an epoch prepared by a process that dies is
    rolled back by Postgres, and ``recover()`` always returns []. The commit
    point is the Postgres COMMIT; the marker settles every restart. Use
    :class:`~sinks.postgres.prepared.PreparedPostgresSink` for a durable prepare.

    Args:
        dsn: libpq DSN or URL, or an SQLAlchemy URL (``postgresql+psycopg://``).
        table: target table name (unquoted; any characters).
        name: the sink's name within the pipeline.
        pipeline: the pipeline's name; None accepts txns of any pipeline (the
            markers and fences are keyed by each txn's own pipeline).
        schema: the target's schema; default the session's current schema.
        key: key columns; default the primary key.
        append_only: the target is keyed by a stable change id and written with
            ON CONFLICT DO NOTHING; deletes are refused.
        state_schema: schema of reconcile_commits / reconcile_fences; default
            the target's schema.
        create_epoch_column: add an ``_epoch bigint`` column to the target if
            missing (the sink fills ``_epoch`` whenever the column exists).
        statement_timeout_ms: per-statement timeout of the sink's sessions.
        lock_timeout_ms: lock wait limit of the sink's sessions.
        resolve_timeout_s: how long an ambiguous COMMIT is resolved for
            (reconnecting while the server restarts) before OutcomeUnknownError.
    """

    mode = "transactional"
    # The open epoch txn dies with its connection: see sinks.base.has_durable_prepare.
    durable_prepare = False

    def __init__(
        self,
        dsn: str | PgTarget,
        table: str,
        *,
        name: str,
        pipeline: str | None = None,
        schema: str | None = None,
        key: Sequence[str] | None = None,
        append_only: bool = False,
        state_schema: str | None = None,
        create_epoch_column: bool = False,
        statement_timeout_ms: int | None = None,
        lock_timeout_ms: int | None = None,
        resolve_timeout_s: float = 30.0,
    ) -> None:
        self._name = validate_name("sink", name)
        self.pipeline = None if pipeline is None else validate_name("pipeline", pipeline)
        self.target = PgTarget.parse(dsn)
        if not isinstance(table, str) or not table:
            raise ConfigurationError(f"postgres sink {name!r}: table must be a non-empty str")
        self.table = table
        self.schema_name = schema
        self.key = tuple(key) if key is not None else None
        self.append_only = append_only
        self.state_schema = state_schema
        self.create_epoch_column = create_epoch_column
        self.statement_timeout_ms = statement_timeout_ms
        self.lock_timeout_ms = lock_timeout_ms
        self.resolve_timeout_s = resolve_timeout_s
        self._schema: TableSchema | None = None
        self._state: StateTables | None = None
        self._sessions = SessionSlot(
            self.target,
            self.application_name,
            statement_timeout=statement_timeout_ms,
            lock_timeout=lock_timeout_ms,
        )
        self._staged: dict[Key, EpochBatch] = {}
        self._open: dict[Key, _OpenTxn] = {}
        self._ensured: set[str] = set()  # pipelines whose fence row exists

    # -- identity -----------------------------------------------------------

    @property
    def name(self) -> str:
        """The sink's name, unique within a pipeline."""
        return self._name

    @property
    def application_name(self) -> str:
        """The application_name of this sink's sessions (visible in pg_stat_activity)."""
        return f"reconcile:{self.pipeline or '*'}:{self._name}"[:63]

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(name={self._name!r}, pipeline={self.pipeline!r}, "
            f"table={self.table!r}, target={self.target.describe()!r})"
        )

    # -- set-up -------------------------------------------------------------

    def setup(self) -> TableSchema:
        """Reflect the target and create the marker and fence tables if missing.

        Called by the first ``prepare``; call it early to fail fast.

        Raises:
            ConfigurationError: the table is missing or unusable, or (prepared
                mode) the server does not allow prepared transactions.
            psycopg.OperationalError: the server cannot be reached (redacted).
        """
        if self._schema is not None and self._state is not None:
            return self._schema
        with self.target.connect(autocommit=True, application_name=self.application_name) as conn:
            self._sessions.apply_settings(conn)
            self._check_server(conn)
            schema = reflect_table(conn, self.schema_name, self.table, self.key)
            if self.create_epoch_column and not schema.has_epoch_column:
                conn.execute(
                    sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS {} bigint").format(
                        schema.ident, sql.Identifier(EPOCH_COLUMN)
                    )
                )
                schema = reflect_table(conn, schema.schema, self.table, self.key)
            if self.append_only and len(schema.key) != 1:
                raise ConfigurationError(
                    f"postgres sink {self._name!r}: append-only table {schema.display} must be "
                    f"keyed by one change-id column, not {list(schema.key)}"
                )
            state = StateTables(self.state_schema or schema.schema)
            state.create(conn)
            if self.pipeline is not None:
                state.ensure(conn, self.pipeline, self._name)
                self._ensured.add(self.pipeline)
        self._schema, self._state = schema, state
        return schema

    def _check_server(self, conn: psycopg.Connection[Any]) -> None:
        """Mode-specific server requirements (none in transactional mode)."""

    def _session(self) -> Session:
        """The idle session, or a new one; it is owned by the caller until released."""
        return self._sessions.take()

    def _release(self, session: Session) -> None:
        self._sessions.release(session)

    def close(self) -> None:
        """Roll back open epochs and close connections."""
        for key in list(self._open):
            self._discard_open(key)
        self._sessions.close()

    def __enter__(self) -> PostgresSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the contract -------------------------------------------------------

    def _check_txn(self, txn_id: SinkTxnId) -> Fatal | None:
        if txn_id.sink != self._name or self.pipeline not in (None, txn_id.pipeline):
            return Fatal(
                f"postgres sink {self._name!r} of pipeline {self.pipeline!r} got txn {txn_id}, "
                "which belongs to another sink"
            )
        return None

    def stage(self, txn_id: SinkTxnId, rows: Iterable[Any]) -> SinkOutcome:
        """Buffer rows (dicts, Changes or Arrow tables) in memory; nothing is sent."""
        if (bad := self._check_txn(txn_id)) is not None:
            return bad
        # Staging again replaces the epoch's rows (a retry re-stages them).
        batch = EpochBatch()
        try:
            id_column = self.setup().key[0] if self.append_only else None
            batch.add(rows, id_column=id_column)
            self._staged[txn_id.key] = batch
        except InvalidInputError as err:
            return Fatal(f"postgres sink {self._name!r}, epoch {txn_id.epoch}: {err}")
        except psycopg.Error as err:
            return Retryable(self.target.redact(f"postgres sink {self._name!r}: {err}"))
        return OK

    def _validated(self, txn_id: SinkTxnId) -> ValidatedBatch | None:
        """The staged batch, validated; None if nothing was staged in this client."""
        schema = self.setup()
        batch = self._staged.get(txn_id.key)
        if batch is None:
            return None
        return validate_batch(schema, batch, sink=self._name, epoch=txn_id.epoch)

    def _prepare_inputs(
        self, txn_id: SinkTxnId
    ) -> tuple[ValidatedBatch | None, Session] | SinkOutcome:
        """The validated staged batch and a session for prepare, or the outcome that stops it."""
        try:
            batch = self._validated(txn_id)
            session = self._session()
        except (InvalidInputError, ConfigurationError) as err:
            return Fatal(self.target.redact(str(err)))
        except psycopg.Error as err:
            return Retryable(self._describe_error("prepare", txn_id, err))
        return batch, session

    def _ensure_pipeline(self, session: Session, pipeline: str) -> None:
        """Create the fence row of (pipeline, sink) once, outside any epoch txn."""
        if pipeline in self._ensured:
            return
        assert self._state is not None
        session.conn.autocommit = True
        try:
            self._state.ensure(session.conn, pipeline, self._name)
        finally:
            session.conn.autocommit = False
        self._ensured.add(pipeline)

    def _not_staged(self, txn_id: SinkTxnId) -> Retryable:
        return Retryable(
            f"postgres sink {self._name!r}: nothing staged for {txn_id} in this client "
            "(staged rows die with their process): stage the epoch again"
        )

    def prepare(self, txn_id: SinkTxnId) -> SinkOutcome:
        """Open the epoch txn: xid, fence, bulk apply, marker. It stays open until commit."""
        if (bad := self._check_txn(txn_id)) is not None:
            return bad
        if txn_id.key in self._open:
            # Preparing a prepared epoch replaces it: roll back, then redo.
            self._discard_open(txn_id.key)
        if self._open:
            other = next(iter(self._open.values())).txn_id
            return Fatal(
                f"postgres sink {self._name!r} (transactional mode) holds one open epoch txn; "
                f"commit or abort {other} before preparing {txn_id}"
            )
        got = self._prepare_inputs(txn_id)
        if not isinstance(got, tuple):
            return got
        batch, session = got
        conn = session.conn
        try:
            self._ensure_pipeline(session, txn_id.pipeline)
            with conn.cursor() as cur:
                state = self._state
                assert state is not None and self._schema is not None
                start = state.start_epoch(
                    cur, txn_id.pipeline, self._name, txn_id.epoch, share=False
                )
                if start.marker is not None:
                    # Already committed (by us before a crash, or by another
                    # generation): a replay must not write it again.
                    conn.rollback()
                    self._release(session)
                    self._open[txn_id.key] = _OpenTxn(txn_id, None)
                    return OK
                if batch is None:
                    conn.rollback()
                    self._release(session)
                    return self._not_staged(txn_id)
                fenced = self._check_fence(cur, txn_id, start.fence_generation)
                if fenced is not None:
                    conn.rollback()
                    self._release(session)
                    return fenced
                apply_with_copy(
                    cur, self._schema, batch, txn_id.epoch, append_only=self.append_only
                )
                state.insert_marker(
                    cur,
                    txn_id.pipeline,
                    self._name,
                    txn_id.epoch,
                    txn_id.generation,
                    batch.row_count,
                )
        except errors.UniqueViolation as err:
            if err.diag.table_name == "reconcile_commits":
                # Another writer committed this epoch while we applied it.
                self._rollback_quietly(session)
                self._open[txn_id.key] = _OpenTxn(txn_id, None)
                return OK
            self._rollback_quietly(session)
            return self._classify("prepare", txn_id, err)
        except psycopg.Error as err:
            # COMMIT was never sent, so nothing of this epoch can be visible.
            self._rollback_quietly(session)
            return self._classify("prepare", txn_id, err)
        self._open[txn_id.key] = _OpenTxn(txn_id, session, start.xid)
        return OK

    def _check_fence(
        self, cur: psycopg.Cursor[Any], txn_id: SinkTxnId, fence: int | None
    ) -> Fatal | None:
        """Reject a stale writer inside the txn; take over if we are newer."""
        if fence is not None and fence == txn_id.generation:
            return None
        if fence is None or fence < txn_id.generation:
            assert self._state is not None
            fence = self._state.raise_fence(cur, txn_id.pipeline, self._name, txn_id.generation)
            if fence == txn_id.generation:
                return None
        return Fatal(
            str(
                FencedError(
                    f"postgres sink {self._name!r}: writer generation {txn_id.generation} is "
                    f"fenced off by generation {fence} for epoch {txn_id.epoch}; nothing was "
                    "written (a newer writer has taken over)"
                )
            )
        )

    def commit(self, txn_id: SinkTxnId) -> SinkOutcome:
        """COMMIT the open epoch txn; resolve a COMMIT without reply from the database.

        Raises:
            OutcomeUnknownError: neither pg_xact_status nor the marker settles it.
        """
        if (bad := self._check_txn(txn_id)) is not None:
            return bad
        txn = self._open.pop(txn_id.key, None)
        if txn is None or txn.session is None:
            return self._settle_by_marker(txn_id, prepared_here=txn is not None)
        session = txn.session
        try:
            session.conn.commit()
        except psycopg.Error as err:
            log.warning("%s", self._describe_error("COMMIT", txn_id, err))
            answered = not session.conn.broken and isinstance(
                err, psycopg.IntegrityError | psycopg.DataError
            )
            session.conn.close()
            if answered:
                # The server itself rejected the COMMIT (e.g. a deferred
                # constraint): that reply is definite, the txn rolled back, and
                # a retry of the same data would fail again.
                return self._classify("COMMIT", txn_id, err)
            # Anything else (no reply, a broken connection, a timeout): the
            # outcome is asked from the database; see resolve.py.
            assert self._state is not None
            inflight = InFlightTxn(txn_id, txn.xid, session.backend)
            resolution = resolve_commit(
                self.target,
                self._state,
                inflight,
                timeout=self.resolve_timeout_s,
                app=self.application_name,
            )
            if resolution is not Resolution.COMMITTED:
                return Retryable(
                    f"postgres sink {self._name!r}: COMMIT of {txn_id} (xid {txn.xid}) did not "
                    "take effect (pg_xact_status: aborted, no marker); retry the epoch"
                )
        else:
            self._release(session)
        self._staged.pop(txn_id.key, None)
        return OK

    def _settle_by_marker(self, txn_id: SinkTxnId, *, prepared_here: bool) -> SinkOutcome:
        """commit() without an open txn: the marker says whether the epoch is in."""
        try:
            self.setup()
            assert self._state is not None
            with self.target.connect(autocommit=True, application_name=self.application_name) as c:
                marker = self._state.find_marker(c, txn_id.pipeline, self._name, txn_id.epoch)
        except ConfigurationError as err:
            return Fatal(self.target.redact(str(err)))
        except psycopg.Error as err:
            return Retryable(self._describe_error("commit", txn_id, err))
        if marker is not None:
            self._staged.pop(txn_id.key, None)
            return OK
        return Fatal(
            f"postgres sink {self._name!r} (transactional mode): {txn_id} is not prepared in this "
            "process and has no marker: the open txn died with its connection or process; "
            "replay the epoch (prepare again)"
        )

    def abort(self, txn_id: SinkTxnId) -> SinkOutcome:
        """Roll back the open epoch txn and drop the staged rows. OK if there is none."""
        if (bad := self._check_txn(txn_id)) is not None:
            return bad
        had_open = txn_id.key in self._open
        self._discard_open(txn_id.key)
        self._staged.pop(txn_id.key, None)
        if not had_open:
            try:
                self.setup()
                assert self._state is not None
                with self.target.connect(
                    autocommit=True, application_name=self.application_name
                ) as conn:
                    marker = self._state.find_marker(
                        conn, txn_id.pipeline, self._name, txn_id.epoch
                    )
            except (psycopg.Error, ConfigurationError):
                # Nothing of this epoch is open in this process, and an epoch
                # txn never outlives its process: there is nothing to discard.
                return OK
            if marker is not None:
                return Fatal(
                    f"postgres sink {self._name!r}: abort of {txn_id}, an epoch that is "
                    "already committed; committed data stays"
                )
        return OK

    def fence(self, pipeline: str, generation: int, *, lock_timeout_ms: int = 5000) -> None:
        """Take over eagerly: raise the fence to ``generation`` now, not at the next epoch.

        From then on, a writer of an older generation is rejected inside its
        own txn. Waits (up to ``lock_timeout_ms``) for an older writer's open
        or prepared epoch txn, which holds the fence row locked.

        Raises:
            FencedError: a newer generation already holds the fence.
            psycopg.Error: the server is unreachable or the wait timed out (redacted).
        """
        self.setup()
        assert self._state is not None
        validate_name("pipeline", pipeline)
        with self.target.connect(autocommit=False, application_name=self.application_name) as c:
            c.execute("SELECT set_config('lock_timeout', %s, true)", (str(int(lock_timeout_ms)),))
            with c.cursor() as cur:
                current = self._state.raise_fence(cur, pipeline, self._name, generation)
            c.commit()
        if current != generation:
            raise FencedError(
                f"postgres sink {self._name!r}: cannot take over with generation {generation}: "
                f"the fence is already at generation {current}",
                generation=generation,
                fence=current,
            )

    def recover(self) -> Sequence[SinkTxnId]:
        """Always []: in transactional mode an open epoch txn never outlives its connection."""
        return []

    # -- errors ---------------------------------------------------------------

    def _discard_open(self, key: Key) -> None:
        txn = self._open.pop(key, None)
        if txn is not None and txn.session is not None:
            self._rollback_quietly(txn.session)

    def _rollback_quietly(self, session: Session) -> None:
        self._sessions.rollback_quietly(session)

    def _describe_error(self, op: str, txn_id: SinkTxnId, err: BaseException) -> str:
        table = self._schema.display if self._schema else self.table
        return describe_failure(self.target, self._name, table, op, txn_id, err)

    def _classify(self, op: str, txn_id: SinkTxnId, err: psycopg.Error) -> SinkOutcome:
        """Either way the txn was rolled back, so nothing of the epoch was written."""
        message = self._describe_error(op, txn_id, err) + "; nothing was written"
        return classify_failure(message, err)
