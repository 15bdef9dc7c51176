"""The PostgreSQL exactly-once sink, transactional mode: one Postgres transaction per epoch."""

from __future__ import annotations

import logging
from typing import Any

import psycopg

from reconcile.core import hooks
from reconcile.core.contract import (
    OK,
    ConfigurationError,
    Fatal,
    MarkerMismatchError,
    ReconcileError,
    Retryable,
    RetryableError,
    SinkOutcome,
    SinkTxnId,
)
from sinks.open_txn import OpenTxnSink

from .apply import apply_with_copy
from .epoch_txn import EpochTxn, EpochTxnSink
from .markers import EpochStart
from .ownership import check_marker
from .replication import confirm_replicated, watched
from .resolve import InFlightTxn, Resolution
from .schema import TableSchema
from .session import Session
from .staging import EpochBatch, ValidatedBatch

__all__ = ["PostgresSink"]

log = logging.getLogger("reconcile.sinks.postgres")

# The epoch txn's COMMIT came back; the cycle has not been told (a crash here
# leaves a committed epoch whose sink never acknowledged it).
COMMIT_RETURNED = hooks.declare("pg.commit.returned")


class PostgresSink(EpochTxnSink, OpenTxnSink[EpochTxn, EpochBatch]):
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
        super()._init_mode()
        OpenTxnSink.__init__(self)

    def close(self) -> None:
        """Roll back open epochs and close connections."""
        self._discard_all()
        super().close()

    def abort(self, txn_id: SinkTxnId) -> SinkOutcome:
        """Roll back the epoch's open txn (``OpenTxnSink.abort``), and forget its schema change."""
        if self._check_txn(txn_id) is None:
            self._forget_evolution(txn_id)
        return OpenTxnSink.abort(self, txn_id)

    def __enter__(self) -> PostgresSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the epoch transaction's steps (the body is EpochTxnSink._epoch_txn) ------

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
