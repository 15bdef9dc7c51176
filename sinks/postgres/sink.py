"""The PostgreSQL exactly-once sink, transactional mode: one Postgres transaction per epoch."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import errors

from reconcile import hooks
from reconcile.contract import (
    OK,
    ConfigurationError,
    Fatal,
    FatalError,
    InvalidInputError,
    MarkerMismatchError,
    Ok,
    ReconcileError,
    Retryable,
    RetryableError,
    SinkOutcome,
    SinkTxnId,
)
from sinks.open_txn import OpenTxnSink

from .apply import apply_with_copy
from .client import FENCE_CHECKED, PgSinkClient
from .markers import MARKERS_TABLE, EpochStart
from .ownership import check_marker
from .replication import confirm_replicated, watched
from .resolve import InFlightTxn, Resolution, Resolved, resolve_commit
from .schema import TableSchema
from .session import Session
from .shared_stage import apply_staged
from .staging import EpochBatch, ValidatedBatch, validate_batch

__all__ = ["EpochTxn", "PostgresSink"]

log = logging.getLogger("reconcile.sinks.postgres")

# The epoch txn's COMMIT came back; the cycle has not been told (a crash here
# leaves a committed epoch whose sink never acknowledged it).
COMMIT_RETURNED = hooks.declare("pg.commit.returned")


@dataclass(frozen=True)
class EpochTxn:
    """An epoch txn that prepare() wrote: its session, and the xid it recorded."""

    session: Session
    xid: str


class PostgresSink(PgSinkClient, OpenTxnSink[EpochTxn, EpochBatch]):
    """Exactly-once sink into one PostgreSQL table, one transaction per epoch.

    ``prepare`` runs BEGIN, records ``pg_current_xact_id()`` and the backend
    pid, raises ``synchronous_commit`` to at least 'on', checks the writer fence
    (row locked FOR UPDATE), COPYs the batch into a temp table, upserts /
    deletes in bulk and inserts the marker (with the target and the writer's
    progress-log id), and leaves the transaction open. ``commit`` runs COMMIT;
    if no reply arrives, the outcome is asked from the database (``resolve.py``).

    Honest limit of this mode: without PREPARE TRANSACTION nothing can be
    durable but invisible, so an epoch prepared by a process that dies is
    rolled back by Postgres, and ``recover()`` always returns []. The commit
    point is the Postgres COMMIT; the marker settles every restart. Use
    :class:`~sinks.postgres.prepared.PreparedPostgresSink` for a durable prepare.
    Arguments: see :class:`~sinks.postgres.client.PgSinkClient`.
    """

    mode = "transactional"
    # The open epoch txn dies with its connection: see sinks.base.has_durable_prepare.
    durable_prepare = False

    def _init_mode(self) -> None:
        OpenTxnSink.__init__(self)
        # The last ambiguous COMMIT's resolution and what decided it (diagnostics).
        self.last_resolution: Resolved | None = None

    def close(self) -> None:
        """Roll back open epochs and close connections."""
        self._discard_all()
        super().close()

    def __enter__(self) -> PostgresSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the contract -------------------------------------------------------

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
        except (ConfigurationError, RetryableError, MarkerMismatchError) as err:
            return self._outcome(err)
        except InvalidInputError as err:  # typed: bad rows stop the pipeline, never retried
            return Fatal(f"postgres sink {self._name!r}, epoch {txn_id.epoch}: {err}", err)
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
        except (ConfigurationError, RetryableError, MarkerMismatchError) as err:
            return self._outcome(err)
        except InvalidInputError as err:
            return Fatal(self.target.redact(str(err)), err)
        except psycopg.Error as err:
            return self._connect_outcome("prepare", txn_id, err)
        return batch, session

    def _not_staged(self, txn_id: SinkTxnId) -> Retryable:
        return Retryable(
            f"postgres sink {self._name!r}: nothing staged for {txn_id} in this client "
            "(staged rows die with their process): stage the epoch again"
        )

    def _committed_by_other(self, txn_id: SinkTxnId) -> SinkOutcome:
        """Our marker insert met another one: OK only if that one is this writer's own."""
        try:
            with self.target.connect(autocommit=True, application_name=self.application_name) as c:
                assert self._state is not None
                marker = self._state.find_marker(c, *txn_id.key)
        except psycopg.Error as err:
            return Retryable(self._describe_error("prepare", txn_id, err))
        if marker is None:  # deleted meanwhile: nothing is committed, try again
            return Retryable(f"postgres sink {self._name!r}: {txn_id} raced a marker; retry")
        assert self._state is not None
        mismatch = check_marker(marker, self._scope(txn_id.pipeline), self._state, where="prepare")
        return OK if mismatch is None else Fatal.of(mismatch)

    def prepare(self, txn_id: SinkTxnId) -> SinkOutcome:
        """Write the epoch in one txn: xid, fence, bulk apply, marker.

        Transactional mode leaves the txn open until commit; prepared mode
        PREPAREs it (see ``_epoch_txn``).
        """
        if (bad := self._check_txn(txn_id)) is not None:
            return bad
        if (refused := self._before_epoch_txn(txn_id)) is not None:
            return refused
        got = self._prepare_inputs(txn_id)
        if not isinstance(got, tuple):
            return got
        return self._epoch_txn(txn_id, *got)

    # -- the epoch transaction: one body for both modes --------------------------

    # FOR SHARE when several epochs may be prepared at once (prepared mode); a
    # takeover's UPDATE of the fence row waits for them all the same.
    _share_fence = False

    def _epoch_txn(
        self, txn_id: SinkTxnId, batch: ValidatedBatch | None, session: Session
    ) -> SinkOutcome:
        """Write the epoch in one txn: xid, fence, rows, marker; the mode ends it (``_end``).

        The steps each mode fills in: ``_clear_epoch`` (what is left of an
        earlier attempt), ``_before_fence``, ``_apply`` (the rows when they were
        not staged on the executors), ``_end`` (leave the txn open, or PREPARE
        it) and ``_keep`` (what the mode records of the outcome).
        """
        conn = session.conn
        state, schema = self._state, self._schema
        assert state is not None and schema is not None
        scope = self._scope(txn_id.pipeline)
        try:
            self._ensure_pipeline(session, txn_id.pipeline)
            if (refused := self._clear_epoch(session, txn_id)) is not None:
                return refused
            with conn.cursor() as cur:
                start = state.start_epoch(
                    cur, txn_id.pipeline, self._name, txn_id.epoch, share=self._share_fence
                )
                if start.marker is not None:
                    # Already committed: by this writer before a crash (a replay
                    # must not write it again), or by another state, which is
                    # an error, never an "already committed".
                    conn.rollback()
                    self._release(session)
                    mismatch = check_marker(start.marker, scope, state, where="prepare")
                    if mismatch is not None:
                        return Fatal.of(mismatch)
                    return self._keep(txn_id, None)
                if batch is None:
                    conn.rollback()
                    self._release(session)
                    return self._not_staged(txn_id)
                self._before_fence(cur, txn_id, start)
                fenced = self._check_fence(cur, txn_id, start.fence)
                if fenced is not None:
                    conn.rollback()
                    self._release(session)
                    return fenced
                hooks.point(FENCE_CHECKED)
                if batch.staged is not None:
                    apply_staged(cur, schema, batch.staged, batch.columns, txn_id.epoch,
                                 append_only=self.append_only)  # fmt: skip
                else:
                    self._apply(cur, schema, batch, txn_id.epoch)
                state.insert_marker(
                    cur,
                    txn_id.key,
                    (schema.schema, schema.table),
                    scope.log_id,
                    txn_id.generation,
                    batch.row_count,
                )
                unconfirmed = self._end(cur, txn_id)
        except FatalError as err:
            # A marker of another state, or staged rows that went missing (re-stage
            # the batch): the typed cause stops the pipeline.
            self._rollback_quietly(session)
            return Fatal.of(err)
        except errors.UniqueViolation as err:
            self._rollback_quietly(session)
            if err.diag.table_name == MARKERS_TABLE:
                # Another writer committed this epoch while we applied it.
                outcome = self._committed_by_other(txn_id)
                return self._keep(txn_id, None) if isinstance(outcome, Ok) else outcome
            return self._classify("prepare", txn_id, err)
        except psycopg.Error as err:
            # The txn was rolled back (or its connection is gone): nothing of
            # the epoch is in, whatever failed. (In prepared mode, a PREPARE
            # TRANSACTION that lost its reply may be prepared after all:
            # recover() lists it, and a retried prepare replaces it.)
            self._rollback_quietly(session)
            return self._classify("prepare", txn_id, err)
        return self._keep(txn_id, EpochTxn(session, start.xid), unconfirmed=unconfirmed)

    def _before_epoch_txn(self, txn_id: SinkTxnId) -> SinkOutcome | None:
        """Before a session is taken: this client holds one open epoch txn at a time."""
        if txn_id.key in self._open:
            # Preparing a prepared epoch replaces it: roll back, then redo.
            self._discard(txn_id.key)
        if self._open:
            other = next(iter(self._open.values())).txn_id
            return Fatal(
                f"postgres sink {self._name!r} (transactional mode) holds one open epoch txn; "
                f"commit or abort {other} before preparing {txn_id}"
            )
        return None

    def _clear_epoch(self, session: Session, txn_id: SinkTxnId) -> SinkOutcome | None:
        """What is left of an earlier attempt of the epoch (none: it died with its txn)."""
        return None

    def _before_fence(self, cur: psycopg.Cursor[Any], txn_id: SinkTxnId, start: EpochStart) -> None:
        """Session settings for the fence check (none in transactional mode)."""

    def _apply(
        self, cur: psycopg.Cursor[Any], schema: TableSchema, batch: ValidatedBatch, epoch: int
    ) -> None:
        """The batch's rows: COPY into temp tables, then upserts and deletes in bulk."""
        apply_with_copy(
            cur,
            schema,
            batch,
            epoch,
            append_only=self.append_only,
            direct_copy_triggers=self.options.direct_copy_triggers,
        )

    def _end(self, cur: psycopg.Cursor[Any], txn_id: SinkTxnId) -> bool:
        """The txn stays open until commit(); nothing is left unconfirmed."""
        return False

    def _keep(
        self, txn_id: SinkTxnId, txn: EpochTxn | None, *, unconfirmed: bool = False
    ) -> SinkOutcome:
        """Hold the open txn for commit(); None: the epoch is in already (its marker)."""
        if txn is None:
            self._hold_committed(txn_id)
        else:
            self._hold(txn_id, txn)
        return OK

    # -- the steps of the open-transaction lifecycle (sinks.open_txn) -----------

    _marker_unreadable = (psycopg.Error, ReconcileError)

    def _sink_label(self) -> str:
        return f"postgres sink {self._name!r}"

    def _commit_open(self, txn_id: SinkTxnId, txn: EpochTxn) -> SinkOutcome:
        """COMMIT the open epoch txn; resolve a COMMIT without reply from the database.

        Raises:
            OutcomeUnknownError: neither pg_xact_status nor the marker settles
                it, or the synchronous standbys do not confirm it in time.
        """
        session = txn.session
        what = f"postgres sink {self._name!r}: COMMIT of {txn_id} (xid {txn.xid})"
        try:
            with watched(session.conn, self.options.commit_timeout_s) as seen:
                session.conn.commit()
            hooks.point(COMMIT_RETURNED)
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
            resolved = self._resolve(InFlightTxn(txn_id, txn.xid, session.backend))
            if isinstance(resolved, Fatal):
                return resolved
            if resolved.resolution is not Resolution.COMMITTED:
                return Retryable(
                    f"{what} did not take effect ({resolved.decided_by.value}: "
                    f"{resolved.detail}); retry the epoch"
                )
        else:
            try:
                if seen.unconfirmed:
                    # The COMMIT came back after a cancel or with a WARNING: its
                    # wait for the synchronous standbys may have been cut short.
                    timeout = self.options.resolve_timeout_s
                    confirm_replicated(session.conn, timeout_s=timeout, what=what)
            finally:
                self._release(session)
        log.info(
            "postgres sink %s: %s committed into %s, xid %s",
            self._name,
            txn_id,
            self._schema.display if self._schema else self.table,
            txn.xid,
            extra={"xid": txn.xid},
        )
        return OK

    def _resolve(self, inflight: InFlightTxn) -> Resolved | Fatal:
        """Ask the database what became of a COMMIT without a definite answer (``resolve.py``).

        Fatal when the marker found belongs to another state; the resolution
        is kept in ``last_resolution``.
        """
        assert self._state is not None
        try:
            resolved = resolve_commit(
                self.target,
                self._state,
                inflight,
                scope=self._scope(inflight.txn_id.pipeline),
                timeout=self.options.resolve_timeout_s,
                app=self.application_name,
            )
        except MarkerMismatchError as mismatch:
            return Fatal.of(mismatch)
        self.last_resolution = resolved
        return resolved

    def _settle_by_marker(self, txn_id: SinkTxnId) -> SinkOutcome:
        """commit() without an open txn: the marker says whether the epoch is in."""
        try:
            self.setup()
            assert self._state is not None
            with self.target.connect(autocommit=True, application_name=self.application_name) as c:
                marker = self._state.find_marker(c, txn_id.pipeline, self._name, txn_id.epoch)
                if marker is not None:
                    scope = self._scope(txn_id.pipeline)
                    mismatch = check_marker(marker, scope, self._state, where="commit")
                    if mismatch is not None:
                        return Fatal.of(mismatch)
                    # In on the primary; reported only once the standbys hold it.
                    confirm_replicated(
                        c,
                        timeout_s=self.options.resolve_timeout_s,
                        what=f"postgres sink {self._name!r}: commit of {txn_id}",
                    )
        except (ConfigurationError, RetryableError, MarkerMismatchError) as err:
            return self._outcome(err)
        except psycopg.Error as err:
            return self._connect_outcome("commit", txn_id, err)
        if marker is not None:
            return OK
        return Fatal(
            f"postgres sink {self._name!r} (transactional mode): {txn_id} is not prepared in this "
            "process and has no marker: the open txn died with its connection or process; "
            "replay the epoch (prepare again)"
        )

    def _read_marker(self, txn_id: SinkTxnId) -> SinkOutcome | None:
        self.setup()
        assert self._state is not None
        with self.target.connect(autocommit=True, application_name=self.application_name) as c:
            marker = self._state.find_marker(c, txn_id.pipeline, self._name, txn_id.epoch)
        if marker is None:
            return None
        mismatch = check_marker(marker, self._scope(txn_id.pipeline), self._state, where="abort")
        return OK if mismatch is None else Fatal.of(mismatch)

    def _roll_back(self, held: EpochTxn) -> None:
        self._rollback_quietly(held.session)
