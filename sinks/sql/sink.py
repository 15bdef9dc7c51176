"""A transactional exactly-once sink for any database SQLAlchemy speaks (one transaction per epoch).

``prepare`` opens a transaction, locks and checks the writer's fence row,
writes the epoch's rows (deletes, then each upserted key deleted and inserted:
the one upsert every database has; in place on MySQL and MariaDB where that is
the same write, see ``rows.py``) and the epoch's marker, and leaves the
transaction open; ``commit`` commits it. There is no transaction id to ask the
database about, so a COMMIT without reply is settled by the marker alone: if
the marker is there the epoch is in, otherwise it is replayed, and the marker's
primary key makes that exactly-once even if the first attempt commits late.
Like the Postgres sink's transactional mode, its prepare is not durable.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
import sqlalchemy as sa

from reconcile.core.contract import (
    OK,
    Change,
    ConfigurationError,
    Fatal,
    FencedError,
    InvalidInputError,
    MarkerMismatchError,
    Ok,
    Retryable,
    SinkOutcome,
    SinkTxnId,
    WriterIdentity,
    validate_name,
)
from reconcile.core.sink import SinkCapabilities
from sinks.open_txn import OpenTxnSink

from .arrow_types import table_arrow_schema
from .binding import open_engine, reflect_target
from .errors import describe_error, prepare_failure, redact_url
from .rows import EPOCH_COLUMN, write_rows
from .sessions import (
    SESSION_DIALECTS,
    Session,
    end_session,
    end_writer_sessions,
    mark_session,
)
from .shape import TargetShape, epoch_shape
from .state import SqlState, untrusted_marker

__all__ = ["EPOCH_COLUMN", "SqlSink"]

log = logging.getLogger("reconcile.sinks.sql")


@dataclass(frozen=True)
class SqlTxn:
    """An epoch txn that prepare() wrote and left open: its connection and transaction."""

    conn: sa.Connection
    txn: sa.Transaction
    session: Session | None = None  # the server's session, where it can be ended (sessions.py)


class SqlSink(OpenTxnSink[SqlTxn, list[Any]]):
    """Exactly-once sink into one table of any SQLAlchemy database.

    The epoch's transaction stays open from ``prepare`` to ``commit``. On
    SQLite, which has one writer per database file, give each sink of a
    pipeline a file of its own: two sinks in one file would wait on each other
    until the busy timeout, and every epoch would abort as retryable.

    Args:
        url: an SQLAlchemy URL (``sqlite:///path.db``, ``postgresql+psycopg://...``).
        table: the target table (it must exist, with a primary key or ``key``).
        name: the sink's name within the pipeline.
        pipeline: optional; ``bind()`` supplies it.
        schema: the target's schema (default: the connection's).
        key: key columns (default: the primary key).
        state_schema: the schema of the ``reconcile_sql_*`` tables (default: the connection's).
    """

    def __init__(
        self,
        url: str,
        table: str,
        *,
        name: str,
        pipeline: str | None = None,
        schema: str | None = None,
        key: Sequence[str] | None = None,
        state_schema: str | None = None,
    ) -> None:
        self._name = validate_name("sink", name)
        self.pipeline = None if pipeline is None else validate_name("pipeline", pipeline)
        self.url, self.table_name, self.schema_name = url, table, schema
        self.key_given = None if key is None else list(key)
        self.engine = open_engine(url, name)
        self.state = SqlState(state_schema)
        self._writer: WriterIdentity | None = None
        self._target: sa.Table | None = None
        self._shape: TargetShape | None = None  # MySQL, MariaDB: the target as bound
        self._unended: dict[tuple[str, str, int], Session] = {}  # epoch -> session to end first
        OpenTxnSink.__init__(self)

    # -- identity and set-up ------------------------------------------------

    @property
    def name(self) -> str:
        return self._name

    @property
    def capabilities(self) -> SinkCapabilities:
        """Not durable (an open transaction); pullable through SQLAlchemy; no bucket checksums."""
        return SinkCapabilities(
            durable_prepare=False,
            epoch_column=self._target is not None and EPOCH_COLUMN in self._target.c,
            pullable=True,
            bucket_checksums=False,
        )

    def __repr__(self) -> str:
        return (
            f"SqlSink(name={self._name!r}, table={self.table_name!r}, url={redact_url(self.url)!r})"
        )

    def _error(self, what: str, err: BaseException) -> str:
        return describe_error(self._name, self.url, what, err)

    def _failed(self, txn_id: SinkTxnId, err: sa.exc.SQLAlchemyError) -> SinkOutcome:
        """What a prepare that failed returns: a refusal stops, a transient failure retries."""
        table = f"{self.schema_name}.{self.table_name}" if self.schema_name else self.table_name
        return prepare_failure(err, txn_id, table=table, sink=self._name, url=self.url)

    def target(self) -> sa.Table:
        """The reflected target table (reflected once; the state tables created if missing).

        Raises:
            ConfigurationError: the database cannot be reached, or the table is
                missing, has no key, or cannot be written exactly (``binding.py``).
        """
        if self._target is None:
            self._target, self._shape = reflect_target(
                self.engine, self.url, self._name, (self.schema_name, self.table_name),
                self.key_given, self.state.metadata,
            )  # fmt: skip
        return self._target

    def shape_now(self, conn: sa.Connection) -> TargetShape | None:
        """The target as it is in ``conn``'s transaction, which holds its metadata lock from here.

        MySQL and MariaDB; None elsewhere. A column changed since bind refuses
        the write here; the unique indexes read here decide the upsert
        (``shape.py``, ``rows.py``).

        Raises:
            InvalidInputError: a column dropped or retyped since bind.
        """
        if self._shape is None:
            return None
        return epoch_shape(conn, self._shape, self.schema_name, self.table_name)

    def arrow_schema(self) -> pa.Schema:
        """The target's columns as the expected state records them (``arrow_types.py``)."""
        return table_arrow_schema(self.target(), self.engine.dialect.name)

    def key_columns(self, table: sa.Table | None = None) -> list[str]:
        table = table if table is not None else self.target()
        return self.key_given or [c.name for c in table.primary_key.columns]

    def _log_id(self) -> str | None:
        return None if self._writer is None else self._writer.log_id

    def bind(self, writer: WriterIdentity) -> None:
        """Bind to the pipeline's writer: check the target, claim the fence row.

        Raises:
            ConfigurationError: another pipeline, or an unusable target.
            MarkerMismatchError: another progress log holds the fence row.
        """
        if self.pipeline is not None and self.pipeline != writer.pipeline:
            raise ConfigurationError(
                f"sql sink {self._name!r} was built for pipeline {self.pipeline!r}, bound to "
                f"{writer.pipeline!r}"
            )
        self._writer, self.pipeline = writer, writer.pipeline
        self.target()
        with self.engine.begin() as conn:
            fence = self.state.claim(conn, writer.pipeline, self._name, writer.log_id)
        if fence[1] != writer.log_id:
            raise MarkerMismatchError(
                f"sql sink {self._name!r}: its fence row belongs to progress log {fence[1]!r}, "
                f"not to this pipeline's {writer.log_id!r}; another state wrote this sink",
                found_log_id=fence[1],
            )

    # -- the contract ---------------------------------------------------------

    def _check_txn(self, txn_id: SinkTxnId) -> Fatal | None:
        if txn_id.sink != self._name or self.pipeline not in (None, txn_id.pipeline):
            return Fatal.of(ConfigurationError(f"sql sink {self._name!r} got txn {txn_id}"))
        return None

    def stage(self, txn_id: SinkTxnId, rows: Iterable[Any]) -> SinkOutcome:
        """Buffer rows: dicts (upserts), Changes, or Arrow tables."""
        if (bad := self._check_txn(txn_id)) is not None:
            return bad
        if isinstance(rows, pa.Table):
            rows = rows.to_pylist()
        staged: list[Any] = []
        for item in rows:
            if isinstance(item, pa.Table):
                staged.extend(item.to_pylist())
            elif isinstance(item, dict | Change):
                staged.append(item)
            else:
                return Fatal(f"sql sink {self._name!r}: cannot stage {type(item).__name__}")
        self._staged[txn_id.key] = staged
        return OK

    def _marker_outcome(self, conn: sa.Connection, txn_id: SinkTxnId) -> SinkOutcome | None:
        marker = self.state.find_marker(conn, *txn_id.key)
        if marker is None:
            return None
        if marker.log_id != self._log_id() or marker.target_table != self.table_name:
            return Fatal.of(
                MarkerMismatchError(
                    f"sql sink {self._name!r}: epoch {txn_id.epoch} was committed into table "
                    f"{marker.target_table!r} by progress log {marker.log_id!r}; this writer "
                    f"({self._log_id()!r}) writes {self.table_name!r}. Nothing was written.",
                    epoch=txn_id.epoch,
                )
            )
        # Ours by its columns, which anyone who can insert a row can copy: held
        # to what the store decided (reconcile.core.claims) before it is believed.
        refused = untrusted_marker(self._name, self.state, marker, self._writer)
        return OK if refused is None else refused  # (a Fatal is falsy: never `refused or OK`)

    def _fenced(self, conn: sa.Connection, txn_id: SinkTxnId) -> Fatal | None:
        fence = self.state.lock_fence(conn, txn_id.pipeline, self._name, txn_id.generation)
        if fence is None:
            fence = self.state.claim(conn, txn_id.pipeline, self._name, self._log_id())
            fence = self.state.lock_fence(conn, txn_id.pipeline, self._name, txn_id.generation)
        assert fence is not None
        if fence[1] != self._log_id():
            return Fatal.of(MarkerMismatchError(
                f"sql sink {self._name!r}: the fence row belongs to progress log {fence[1]!r}"
            ))  # fmt: skip
        if fence[0] != txn_id.generation:
            return Fatal.of(FencedError(
                f"sql sink {self._name!r}: generation {txn_id.generation} is fenced off by "
                f"{fence[0]}; nothing was written", generation=txn_id.generation, fence=fence[0],
            ))  # fmt: skip
        return None

    def prepare(self, txn_id: SinkTxnId) -> SinkOutcome:
        """Open the epoch's transaction: fence, rows, marker. It stays open until commit."""
        if (bad := self._check_txn(txn_id)) is not None:
            return bad
        self._discard(txn_id.key)  # preparing a prepared epoch replaces it
        try:
            table = self.target()
        except ConfigurationError as err:
            return Fatal.of(err)
        conn = self.engine.connect()
        txn = conn.begin()
        try:
            # Marked before anything is locked: a resolver or a takeover tells
            # this session apart by its mark, never by its id (sessions.py).
            session = mark_session(conn, txn_id.pipeline, self._name, self._log_id())
            done = self._marker_outcome(conn, txn_id)
            if done is not None:
                txn.rollback()
                conn.close()
                if isinstance(done, Ok):
                    self._hold_committed(txn_id)
                return done
            staged = self._staged.get(txn_id.key)
            if staged is None:
                txn.rollback()
                conn.close()
                return Retryable(f"sql sink {self._name!r}: nothing staged for {txn_id}")
            if (fenced := self._fenced(conn, txn_id)) is not None:
                txn.rollback()
                conn.close()
                return fenced
            shape = self.shape_now(conn)
            written = write_rows(conn, table, self.key_columns(), staged, txn_id.epoch, shape)
            conn.execute(self.state.markers.insert().values(
                pipeline=txn_id.pipeline, sink=self._name, epoch=txn_id.epoch,
                target_table=self.table_name, log_id=self._log_id(),
                generation=txn_id.generation, row_count=written,
            ))  # fmt: skip
        except InvalidInputError as err:
            txn.rollback()
            conn.close()
            # Not a retry's to cure: the table must be put back (or the change made through the
            # pipeline) first. The details (table) stay with the error.
            return Fatal.of(type(err)(
                f"sql sink {self._name!r}: epoch {txn_id.epoch} refused, nothing of it was "
                f"written: {err}", **err.details,
            ))  # fmt: skip
        except sa.exc.IntegrityError as err:
            txn.rollback()
            conn.close()
            if self.state.markers.name in str(err):
                with self.engine.connect() as c:
                    again = self._marker_outcome(c, txn_id)
                if again is not None:
                    if isinstance(again, Ok):
                        self._hold_committed(txn_id)
                    return again
            return self._failed(txn_id, err)
        except sa.exc.SQLAlchemyError as err:
            txn.rollback()
            conn.close()
            return self._failed(txn_id, err)
        self._hold(txn_id, SqlTxn(conn, txn, session))
        return OK

    # -- the steps of the open-transaction lifecycle (sinks.open_txn) -----------

    _marker_unreadable = (sa.exc.SQLAlchemyError,)

    def _sink_label(self) -> str:
        return f"sql sink {self._name!r}"

    def _commit_open(self, txn_id: SinkTxnId, held: SqlTxn) -> SinkOutcome:
        """COMMIT the open transaction; without an answer, the marker settles it."""
        try:
            held.txn.commit()
            return OK
        except sa.exc.SQLAlchemyError as err:
            log.warning("%s", self._error(f"COMMIT of {txn_id}", err))
        finally:
            held.conn.close()
        # A COMMIT without a definite answer: there is no transaction id to ask
        # the database about; the marker, written in the same transaction, is
        # the only evidence, once the session that ran it has ended (else its
        # COMMIT may still land after the marker was read: sessions.py).
        if held.session is not None:
            self._unended[txn_id.key] = held.session
        return self._settle_by_marker(txn_id)

    def _settle_by_marker(self, txn_id: SinkTxnId) -> SinkOutcome:
        try:
            if (session := self._unended.get(txn_id.key)) is not None:
                end_session(self.engine, session)  # kept until it ended: a retry ends it first
                self._unended.pop(txn_id.key, None)
            with self.engine.connect() as conn:
                done = self._marker_outcome(conn, txn_id)
        except sa.exc.SQLAlchemyError as err:
            return Retryable(self._error(f"commit({txn_id}): cannot read the marker", err))
        if done is not None:
            return done
        return Fatal(
            f"sql sink {self._name!r}: {txn_id} is not open in this process and has no marker: "
            "it did not commit; replay the epoch (prepare again)"
        )

    def _read_marker(self, txn_id: SinkTxnId) -> SinkOutcome | None:
        with self.engine.connect() as conn:
            return self._marker_outcome(conn, txn_id)

    def _roll_back(self, held: SqlTxn) -> None:
        try:
            held.txn.rollback()
        except sa.exc.SQLAlchemyError as err:
            log.warning("%s", self._error("rollback failed; closing the connection", err))
        finally:
            held.conn.close()

    def end_writer_sessions(self, writer: WriterIdentity) -> int:
        """End the sessions ``writer``'s sink holds open elsewhere (a takeover's); how many ended.

        Only sessions the writer's epochs marked (``sessions.py``), of this
        sink's user: a paused old main's open epoch, whose locks the new
        writer would otherwise wait out. Never raises for a database failure.
        """
        if self.engine.dialect.name not in SESSION_DIALECTS:
            return 0
        try:
            return end_writer_sessions(self.engine, writer, self._name)
        except sa.exc.SQLAlchemyError as err:
            log.warning("%s", self._error("could not look for the old writer's sessions", err))
            return 0

    def close(self) -> None:
        """Roll back open epochs, close connections."""
        self._discard_all()
        self.engine.dispose()

    def recovery_target(self, pipeline: str, generation: int | None, *, write: bool) -> Any:
        """This sink's table as a pull-and-diff target (``reconcile.recovery``)."""
        from .recovery import SqlRecoveryTarget

        return SqlRecoveryTarget(self, pipeline, generation, write=write)
