"""The PostgreSQL sink in prepared-transaction (2PC) mode: PREPARE TRANSACTION per epoch."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import errors, sql

from reconcile.core.contract import (
    OK,
    ConfigurationError,
    Fatal,
    FencedError,
    MarkerMismatchError,
    Ok,
    OutcomeUnknownError,
    ReconcileError,
    Retryable,
    RetryableError,
    SinkOutcome,
    SinkTxnId,
    TxnIdParseError,
)

from .apply import apply_with_arrays
from .epoch_txn import EpochTxn
from .health import warn_old_prepared
from .markers import SYNC_COMMIT_AT_LEAST_ON, EpochStart
from .ownership import check_marker
from .replication import confirm_replicated, watched
from .resolve import InFlightTxn, Resolution
from .schema import TableSchema
from .session import Session
from .sink import PostgresSink
from .staging import ValidatedBatch

__all__ = ["PreparedPostgresSink"]

log = logging.getLogger("reconcile.sinks.postgres")

_TAKEOVER_LOCK_TIMEOUT_MS = 5000
_COMMIT_ATTEMPTS = 5


class PreparedPostgresSink(PostgresSink):
    """Exactly-once sink whose prepare is ``PREPARE TRANSACTION '<txn id>'``.

    A prepared epoch survives a crash of this process and of the server;
    ``recover()`` lists them from ``pg_prepared_xacts`` (our pipeline and sink
    only), ``commit`` is ``COMMIT PREPARED`` and ``abort`` is ``ROLLBACK
    PREPARED``. The marker is written inside the prepared txn, so it proves
    a commit later. Several epochs (and several sinks) may be prepared at once:
    the fence row is locked FOR SHARE, which a takeover's UPDATE still waits for.

    Postgres does not allow temporary tables in a prepared transaction, so the
    batch is applied with one ``unnest()`` statement per operation, not COPY.
    The server needs ``max_prepared_transactions > 0``. Arguments as for
    :class:`PostgresSink`.
    """

    mode = "prepared"
    durable_prepare = True  # PREPARE TRANSACTION survives crashes and restarts

    def _init_mode(self) -> None:
        super()._init_mode()
        self._inflight: dict[tuple[str, str, int], str] = {}  # key -> xid of the prepared txn

    def _check_server(self, conn: psycopg.Connection[Any]) -> None:
        row = conn.execute("SELECT current_setting('max_prepared_transactions')::int").fetchone()
        if row is None or int(row[0]) <= 0:
            raise ConfigurationError(
                f"postgres sink {self.name!r} (prepared mode): server {self.target.describe()} "
                "has max_prepared_transactions = 0, so PREPARE TRANSACTION is disabled. Set "
                "max_prepared_transactions in postgresql.conf to at least the number of epochs "
                "prepared at once across all sinks (e.g. 100; it must be >= max_connections "
                "on a standby too) and restart the server, or use transactional mode"
            )

    def _after_start_up(self, conn: psycopg.Connection[Any], pipeline: str) -> None:
        # recover() lists only this sink's txns; a renamed or removed sink's
        # stay prepared (and pin VACUUM) until someone ends them: say so.
        warn_old_prepared(conn, pipeline, self.options.prepared_warn_after_s, self._what())

    # -- helpers ----------------------------------------------------------------

    def _prepared_here(self, conn: psycopg.Connection[Any]) -> list[SinkTxnId]:
        """Prepared txns of this pipeline and sink in this database (parsed from gids)."""
        found = []
        for (gid,) in conn.execute(
            "SELECT gid FROM pg_prepared_xacts WHERE database = current_database()"
        ):
            try:
                txn_id = SinkTxnId.from_string(gid)
            except TxnIdParseError:
                continue  # another application's prepared txn
            if txn_id.sink == self.name and self.pipeline in (None, txn_id.pipeline):
                found.append(txn_id)
        return found

    def _finish(self, conn: psycopg.Connection[Any], verb: str, txn_id: SinkTxnId) -> bool:
        """COMMIT PREPARED / ROLLBACK PREPARED, which must run outside a txn block.

        Returns True if the statement came back after a cancel or with a
        WARNING (a synchronous-replication wait that may have been cut short).
        """
        conn.autocommit = True
        try:
            if verb == "COMMIT PREPARED":
                # The prepared txn's own SET LOCAL is gone: the level of this
                # session applies to its commit record.
                conn.execute("SELECT " + SYNC_COMMIT_AT_LEAST_ON.format(local="false"))
            with watched(conn, self.options.commit_timeout_s) as seen:
                conn.execute(sql.SQL(verb + " {}").format(sql.Literal(str(txn_id))))
            return seen.unconfirmed
        finally:
            if not conn.closed:
                conn.autocommit = False

    def _marker_outcome(
        self, conn: psycopg.Connection[Any], txn_id: SinkTxnId, where: str
    ) -> SinkOutcome | None:
        """OK: this writer's marker shows the epoch committed; Fatal: another's; None: none."""
        self.setup()
        assert self._state is not None
        marker = self._state.find_marker(conn, txn_id.pipeline, self.name, txn_id.epoch)
        if marker is None:
            return None
        mismatch = check_marker(marker, self._scope(txn_id.pipeline), self._state, where=where)
        return OK if mismatch is None else Fatal.of(mismatch)

    # -- the epoch transaction's steps (the body is PostgresSink._epoch_txn) ------

    _share_fence = True  # several epochs (and sinks) may be prepared at once

    def _before_epoch_txn(self, txn_id: SinkTxnId) -> SinkOutcome | None:
        """Nothing: several epochs may be prepared at once (each in its own txn)."""
        return None

    def _clear_epoch(self, session: Session, txn_id: SinkTxnId) -> SinkOutcome | None:
        """Roll back this epoch's txn prepared by an earlier attempt; refuse a newer one's.

        Preparing a prepared epoch replaces it. A prepared txn of this epoch by
        a newer generation means that we are the zombie.
        """
        conn = session.conn
        for other in self._prepared_here(conn):
            if other.key != txn_id.key:
                continue
            if other.generation > txn_id.generation:
                conn.rollback()
                self._release(session)
                return Fatal.of(
                    FencedError(
                        f"postgres sink {self.name!r}: writer generation "
                        f"{txn_id.generation} is fenced off: {other} is prepared by a "
                        "newer generation; nothing was written"
                    )
                )
            conn.rollback()
            self._finish(conn, "ROLLBACK PREPARED", other)
        return None

    def _before_fence(self, cur: psycopg.Cursor[Any], txn_id: SinkTxnId, start: EpochStart) -> None:
        if start.fence_generation != txn_id.generation and self.options.lock_timeout_ms is None:
            # A takeover waits for the older generation's prepared
            # txns, which only recover() + commit/abort can end.
            cur.execute(f"SET LOCAL lock_timeout = {_TAKEOVER_LOCK_TIMEOUT_MS}")

    def _apply(
        self, cur: psycopg.Cursor[Any], schema: TableSchema, batch: ValidatedBatch, epoch: int
    ) -> None:
        """The batch's rows by ``unnest()`` statements: no temp table in a prepared txn."""
        apply_with_arrays(cur, schema, batch, epoch, append_only=self.append_only)

    def _end(self, cur: psycopg.Cursor[Any], txn_id: SinkTxnId) -> bool:
        """PREPARE TRANSACTION: durable, invisible, recoverable; True if not confirmed."""
        with watched(cur.connection, self.options.commit_timeout_s) as seen:
            cur.execute(sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(str(txn_id))))
        return seen.unconfirmed

    def _keep(
        self, txn_id: SinkTxnId, txn: EpochTxn | None, *, unconfirmed: bool = False
    ) -> SinkOutcome:
        """Remember the prepared txn's xid (commit() resolves by it); the session is free."""
        if txn is None:
            return OK  # in already: commit() finds the marker
        self._inflight[txn_id.key] = txn.xid
        self._release(txn.session)
        if unconfirmed:
            # PREPARE waited for the synchronous standbys and was cut short: the
            # prepared txn may be on the primary only. Not durable enough to
            # say OK; the cycle aborts the epoch and tries again.
            return Retryable(
                f"postgres sink {self.name!r}: PREPARE TRANSACTION {txn_id} was not confirmed "
                "by the synchronous standby in time; abort and retry the epoch"
            )
        return OK

    # -- the contract -------------------------------------------------------------

    def commit(self, txn_id: SinkTxnId) -> SinkOutcome:
        """COMMIT PREPARED; OK if the marker shows the epoch already committed.

        Raises:
            OutcomeUnknownError: the reply was lost and neither the prepared
                txn list, pg_xact_status nor the marker settles it.
        """
        if (bad := self._check_txn(txn_id)) is not None:
            return bad
        for _attempt in range(_COMMIT_ATTEMPTS):
            try:
                session = self._session()
            except psycopg.Error as err:
                return self._connect_outcome("commit", txn_id, err)
            outcome = self._commit_once(session, txn_id)
            if outcome is not None:
                return outcome
        raise OutcomeUnknownError(
            f"postgres sink {self.name!r}: COMMIT PREPARED {txn_id} kept failing after "
            f"{_COMMIT_ATTEMPTS} attempts; it is still prepared (see pg_prepared_xacts)",
            txn_id=str(txn_id),
        )

    def _commit_once(self, session: Session, txn_id: SinkTxnId) -> SinkOutcome | None:
        """One COMMIT PREPARED attempt; None means "still prepared, try again"."""
        conn = session.conn
        state = self._state
        what = f"postgres sink {self.name!r}: COMMIT PREPARED {txn_id}"
        try:
            target = txn_id  # the gid to commit (idempotency keys on the epoch)
            same_epoch = [t for t in self._prepared_here(conn) if t.key == txn_id.key]
            conn.rollback()
            # Idempotency keys on the epoch: commit the one that is prepared,
            # but never a newer generation's txn (we may be the zombie).
            listed = [t for t in same_epoch if t.generation <= txn_id.generation]
            if same_epoch and not listed:
                self._release(session)
                return Fatal.of(
                    FencedError(
                        f"postgres sink {self.name!r}: writer generation {txn_id.generation} "
                        f"is fenced off: {same_epoch[0]} is prepared by a newer generation"
                    )
                )
            if listed and txn_id not in listed:
                target = max(listed, key=lambda t: t.generation)
            if not listed:
                found = self._marker_outcome(conn, txn_id, "commit")
                if isinstance(found, Ok):
                    # In on the primary; reported only once the standbys hold it.
                    confirm_replicated(conn, timeout_s=self.options.resolve_timeout_s, what=what)
                conn.rollback()
                self._release(session)
                if found is not None:
                    if isinstance(found, Ok):
                        self._forget(txn_id)
                    return found
                return Fatal(
                    f"postgres sink {self.name!r}: {txn_id} is neither prepared nor committed "
                    "(no marker): it was rolled back; replay the epoch"
                )
            if self._finish(conn, "COMMIT PREPARED", target):
                confirm_replicated(conn, timeout_s=self.options.resolve_timeout_s, what=what)
        except (ConfigurationError, RetryableError, MarkerMismatchError) as err:
            self._rollback_quietly(session)
            return self._outcome(err)
        except psycopg.Error as err:
            log.warning("%s", self._describe_error("COMMIT PREPARED", txn_id, err))
            conn.close()
            xid = self._inflight.get(txn_id.key)
            if xid is None or state is None:
                return None  # no xid known here: look at pg_prepared_xacts again
            resolved = self._resolve(InFlightTxn(txn_id, xid, session.backend, str(target)))
            if isinstance(resolved, Fatal):
                return resolved
            if resolved.resolution is Resolution.PREPARED:
                return None
            if resolved.resolution is Resolution.ABORTED:
                return Retryable(
                    f"postgres sink {self.name!r}: prepared txn {txn_id} (xid {xid}) was rolled "
                    "back; retry the epoch"
                )
            self._forget(txn_id)
            return OK
        self._release(session)
        log.info(
            "postgres sink %s: %s committed (COMMIT PREPARED %s), xid %s",
            self.name,
            txn_id,
            target,
            self._inflight.get(txn_id.key, "?"),
            extra={"xid": self._inflight.get(txn_id.key)},
        )
        self._forget(txn_id)
        return OK

    def _forget(self, txn_id: SinkTxnId) -> None:
        self._inflight.pop(txn_id.key, None)
        self._staged.pop(txn_id.key, None)

    def abort(self, txn_id: SinkTxnId) -> SinkOutcome:
        """ROLLBACK PREPARED this epoch's txns of our generation or older. OK if none."""
        if (bad := self._check_txn(txn_id)) is not None:
            return bad
        self._forget(txn_id)
        self._forget_evolution(txn_id)
        try:
            session = self._session()
        except psycopg.Error as err:
            return self._connect_outcome("abort", txn_id, err)
        conn = session.conn
        try:
            listed = [t for t in self._prepared_here(conn) if t.key == txn_id.key]
            conn.rollback()
            for other in listed:
                # Never roll back a newer generation's txn: we may be the zombie.
                if other.generation <= txn_id.generation:
                    try:
                        self._finish(conn, "ROLLBACK PREPARED", other)
                    except errors.UndefinedObject:
                        conn.rollback()  # finished meanwhile by someone else
            if not listed:
                found = self._marker_outcome(conn, txn_id, "abort")
                conn.rollback()
                if found is not None:
                    self._release(session)
                    if isinstance(found, Ok):
                        return Fatal(
                            f"postgres sink {self.name!r}: abort of {txn_id}, an epoch that "
                            "is already committed; committed data stays"
                        )
                    return found
        except ReconcileError as err:
            self._rollback_quietly(session)
            return self._outcome(err)
        except psycopg.Error as err:
            self._rollback_quietly(session)
            return Retryable(self._describe_error("abort", txn_id, err))
        self._release(session)
        return OK

    def recover(self) -> Sequence[SinkTxnId]:
        """The txns of this pipeline and sink that the server holds prepared.

        Raises:
            RetryableError: the server cannot be reached (password redacted).
        """
        try:
            with self.target.connect(
                autocommit=True, application_name=self.application_name
            ) as conn:
                return sorted(self._prepared_here(conn))
        except psycopg.Error as err:
            raise RetryableError(
                self.target.redact(f"postgres sink {self.name!r}: recover() failed: {err}")
            ) from None
