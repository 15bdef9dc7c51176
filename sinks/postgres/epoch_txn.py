"""One epoch transaction for both Postgres sink modes: stage, then xid, fence, rows, marker.

:class:`EpochTxnSink` holds what the transactional mode (``sink.py``) and the
prepared mode (``prepared.py``) do alike to write an epoch: the staged batch,
and ONE body for the epoch's transaction (``_epoch_txn``): record the xid and
lock the fence row, stop at the epoch's marker (a replay), check the fence,
write the rows and the marker, handle every failure. Each mode fills in the
steps where they differ: what is left of an earlier attempt, the rows' way in
(COPY, or ``unnest()`` where a prepared txn allows no temp table), how the txn
ends (left open, or PREPAREd) and what is kept of it for ``commit``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import errors

from reconcile.core import hooks
from reconcile.core.contract import (
    OK,
    ConfigurationError,
    Fatal,
    FatalError,
    InvalidInputError,
    MarkerMismatchError,
    Ok,
    Retryable,
    RetryableError,
    SinkOutcome,
    SinkTxnId,
)
from reconcile.core.schema_change import (
    SchemaChangeRefused,
)
from sinks.open_txn import Key

from .client import FENCE_CHECKED, PgSinkClient
from .evolution import projected
from .evolving import SchemaEvolving
from .foreign import check_foreign_changes
from .markers import MARKERS_TABLE, EpochStart
from .ownership import check_marker
from .resolve import InFlightTxn, Resolved, resolve_commit
from .schema import TableSchema
from .session import Session
from .shared_stage import apply_staged
from .staging import EpochBatch, ValidatedBatch, validate_batch

__all__ = ["EpochTxn", "EpochTxnSink"]


@dataclass(frozen=True)
class EpochTxn:
    """An epoch txn that prepare() wrote: its session, and the xid it recorded."""

    session: Session
    xid: str


class EpochTxnSink(SchemaEvolving, PgSinkClient, ABC):
    """Staging and the epoch transaction of both Postgres modes; a mode fills in its steps.

    Arguments: see :class:`~sinks.postgres.client.PgSinkClient`.
    """

    # FOR SHARE when several epochs may be prepared at once (prepared mode); a
    # takeover's UPDATE of the fence row waits for them all the same.
    _share_fence = False

    def _init_mode(self) -> None:
        self._staged: dict[Key, EpochBatch] = {}
        self._init_evolution()
        # The last ambiguous COMMIT's resolution and what decided it (diagnostics).
        self.last_resolution: Resolved | None = None

    # -- staging --------------------------------------------------------------

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
        if self._evolution is not None:
            # The rows carry the columns as the epoch's txn will make them.
            schema = projected(schema, self._evolution)
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

    # -- the epoch transaction: one body for both modes --------------------------

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
                if self._evolution is not None:
                    # After the fence check: a zombie never alters the table.
                    schema = self._evolve(conn, cur, txn_id)
                # Someone else's change since the rows were checked stops the
                # epoch here, named, before a row goes in (foreign.py).
                check_foreign_changes(cur, schema, batch.columns, sink=self._name)
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
        except RetryableError as err:
            # The direct COPY raced a concurrent writer (apply.DirectCopyRaced):
            # the txn is lost, nothing is in; the retry takes the general path.
            self._rollback_quietly(session)
            return Retryable(f"postgres sink {self._name!r}, epoch {txn_id.epoch}: {err}", err)
        except SchemaChangeRefused as err:
            # The table changed since the rows were checked (a column dropped,
            # retyped or added by hand): the DDL and the rows roll back
            # together; nothing is in.
            self._rollback_quietly(session)
            return Fatal(f"postgres sink {self._name!r}, epoch {txn_id.epoch}: {err}", err)
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

    # -- the steps each mode fills in -------------------------------------------

    @abstractmethod
    def _before_epoch_txn(self, txn_id: SinkTxnId) -> SinkOutcome | None:
        """Before a session is taken: an outcome that stops the prepare, or None."""

    @abstractmethod
    def _clear_epoch(self, session: Session, txn_id: SinkTxnId) -> SinkOutcome | None:
        """What is left of an earlier attempt of the epoch: an outcome that stops, or None."""

    @abstractmethod
    def _before_fence(self, cur: psycopg.Cursor[Any], txn_id: SinkTxnId, start: EpochStart) -> None:
        """Session settings for the fence check."""

    @abstractmethod
    def _apply(
        self, cur: psycopg.Cursor[Any], schema: TableSchema, batch: ValidatedBatch, epoch: int
    ) -> None:
        """The batch's rows, when they were not staged on the executors."""

    @abstractmethod
    def _end(self, cur: psycopg.Cursor[Any], txn_id: SinkTxnId) -> bool:
        """End the epoch's writes in the txn; True if its ending was not confirmed."""

    @abstractmethod
    def _keep(
        self, txn_id: SinkTxnId, txn: EpochTxn | None, *, unconfirmed: bool = False
    ) -> SinkOutcome:
        """Keep what ``commit`` needs; ``txn`` None: the epoch is in already (its marker)."""

    # -- resolving a COMMIT without an answer --------------------------------------

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
