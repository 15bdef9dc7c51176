"""What both Postgres sink modes share: options, binding to a writer, start-up, fencing, errors."""

from __future__ import annotations

import logging
from typing import Any, Unpack

import psycopg
import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
from psycopg import errors

from reconcile.core import hooks
from reconcile.core.conform import SinkColumn
from reconcile.core.contract import (
    ConfigurationError,
    Fatal,
    ReconcileError,
    Retryable,
    RetryableError,
    SinkOutcome,
    SinkTxnId,
    WriterIdentity,
    validate_name,
)
from reconcile.core.sink import SinkCapabilities
from reconcile.core.target import RecoveryTarget
from sinks.objects.postgres import open_state_schema

from .arrow_types import target_arrow_schema
from .binding import claim_scope, connect_checked, open_target, startup_failure
from .connection import PgTarget, connect_failure
from .fencing import check_epoch_fence, claim_fence_row, take_over
from .markers import Fence, StateTables
from .options import PostgresKeywords, PostgresOptions
from .ownership import Scope
from .pull_columns import sink_columns
from .schema import TableSchema
from .session import Session, SessionSlot, classify_failure, describe_failure
from .shared_stage import PgStageTarget, reflect_target

__all__ = ["FENCE_CHECKED", "PgSinkClient"]

log = logging.getLogger("reconcile.sinks.postgres")

# Inside every epoch txn, after the writer's generation passed the fence (the
# fence row is locked by then) and before the data, the marker and the COMMIT.
# A takeover that lands here must wait for this txn to end.
FENCE_CHECKED = hooks.declare("pg.prepare.fence_checked")


class PgSinkClient:
    """Options, identity, binding and the shared helpers of :class:`PostgresSink`.

    Args:
        dsn: libpq DSN or URL, or an SQLAlchemy URL (``postgresql+psycopg://``).
        table: target table name (unquoted; any characters).
        name: the sink's name within the pipeline.
        pipeline: optional: ``bind()`` (called by ``CommitCycle.start()``)
            supplies it; if given, it must equal the bound pipeline. A sink
            used directly without ``pipeline`` accepts txns of any pipeline.
        **options: the keywords of :class:`~sinks.postgres.options.PostgresOptions`
            (schema, key, append_only, timeouts, ...), kept as ``options``.
    """

    durable_prepare = False  # overridden by the prepared mode

    @property
    def capabilities(self) -> SinkCapabilities:
        """Durable prepare in prepared mode; ``_epoch`` once the target is known to have it.

        Pullable and with bucket checksums: ``recovery_target`` pulls the table
        with COPY into Arrow and has the server checksum key ranges. With a
        shared stage: ``stage_target`` gives Spark's executors a staging
        table of the sink's own, which the epoch's transaction reads.
        """
        return SinkCapabilities(
            durable_prepare=self.durable_prepare,
            epoch_column=self._schema is not None and self._schema.has_epoch_column,
            pullable=True,
            bucket_checksums=True,
            shared_stage=True,
        )

    def stage_target(self) -> PgStageTarget:
        """The target as the executors' staging path plans it (read without binding)."""
        return PgStageTarget(self, reflect_target(self))

    def recovery_target(
        self, pipeline: str, generation: int | None, *, write: bool
    ) -> RecoveryTarget:
        """This sink's table as a pull-and-diff target (``reconcile.recovery``).

        Args:
            pipeline: whose markers and fence row.
            generation: the writer generation the repair is fenced with; None
                for an operator's repair (it acts for the fence's owner).
            write: a repair may follow (False: verify only reads).
        """
        from .recovery import PgRecoveryTarget

        return PgRecoveryTarget(self, pipeline, generation, write=write)

    mode = "transactional"

    def __init__(
        self,
        dsn: str | PgTarget,
        table: str,
        *,
        name: str,
        pipeline: str | None = None,
        **options: Unpack[PostgresKeywords],
    ) -> None:
        self._name = validate_name("sink", name)
        self.pipeline = None if pipeline is None else validate_name("pipeline", pipeline)
        self.target = PgTarget.parse(dsn)
        if not isinstance(table, str) or not table:
            raise ConfigurationError(f"postgres sink {name!r}: table must be a non-empty str")
        self.table = table
        self.options = PostgresOptions(**options)
        self._writer: WriterIdentity | None = None
        self._schema: TableSchema | None = None
        self._state: StateTables | None = None
        self._sessions = SessionSlot(
            self.target,
            self.application_name,
            statement_timeout=self.options.statement_timeout_ms,
            lock_timeout=self.options.lock_timeout_ms,
            idle_in_transaction_session_timeout=self.options.idle_in_transaction_timeout_ms,
        )
        self._ensured: set[str] = set()  # pipelines whose fence row is claimed
        self._init_mode()

    def _init_mode(self) -> None:
        """The mode's own state (each mode's class adds to it; none here)."""

    @property
    def append_only(self) -> bool:
        """The target is keyed by a stable change id; deletes are refused (``options``)."""
        return self.options.append_only

    # -- identity -----------------------------------------------------------

    @property
    def name(self) -> str:
        """The sink's name, unique within a pipeline."""
        return self._name

    @property
    def writer(self) -> WriterIdentity | None:
        """The writer bound by ``bind()``; None for a sink used directly."""
        return self._writer

    @property
    def application_name(self) -> str:
        """The application_name of this sink's sessions (visible in pg_stat_activity)."""
        return f"reconcile:{self.pipeline or '*'}:{self._name}"[:63]

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(name={self._name!r}, pipeline={self.pipeline!r}, "
            f"table={self.table!r}, target={self.target.describe()!r})"
        )

    def _what(self) -> str:
        return f"postgres sink {self._name!r}" + (f" ({self.mode} mode)" if self.mode else "")

    # -- binding and set-up -------------------------------------------------

    def bind(self, writer: WriterIdentity) -> None:
        """Bind to the pipeline's writer and check everything that start-up can check.

        Connects; checks the server (prepared mode: max_prepared_transactions);
        reflects the target; finds, creates or verifies the marker and fence
        tables; claims the fence row of (pipeline, sink) for this progress log,
        refusing it if another state holds it. From then on every marker is
        written with the writer's log id and the target, and checked against
        them wherever it is read. Idempotent for the same writer.

        A sink that is never bound (used directly, without a commit cycle)
        works as before, as its own writer: its markers carry no log id, so
        they never pass for a bound pipeline's, nor the other way round.

        Raises:
            ConfigurationError: a ``pipeline=`` that differs, a sink bound to
                another writer, wrong credentials, no such database or table,
                max_prepared_transactions = 0, untrustworthy state tables.
            RetryableError: the server is unreachable or restarting.
            MarkerMismatchError: another progress log owns this sink's markers.
        """
        if not isinstance(writer, WriterIdentity):
            raise ConfigurationError(
                f"{self._what()}: bind() takes a WriterIdentity, got {writer!r}"
            )
        if self.pipeline is not None and self.pipeline != writer.pipeline:
            raise ConfigurationError(
                f"{self._what()} was built with pipeline={self.pipeline!r}, but the commit "
                f"cycle binds it to pipeline {writer.pipeline!r}: give the pipeline name once, "
                "to CommitCycle (the sink learns it from bind())",
                pipeline=self.pipeline,
                bound=writer.pipeline,
            )
        if self._writer is not None and self._writer != writer:
            raise ConfigurationError(
                f"{self._what()} is bound to progress log {self._writer.log_id!r} already; "
                f"a sink client serves one writer (got log {writer.log_id!r})"
            )
        if self._writer is None and self._schema is not None:
            raise ConfigurationError(
                f"{self._what()} was used unbound (as its own writer) before bind(): build "
                "a new sink client for the commit cycle"
            )
        previous = self.pipeline
        self._writer, self.pipeline = writer, writer.pipeline
        self._sessions.application_name = self.application_name
        try:
            self._start_up()
        except BaseException:
            self._writer, self.pipeline = None, previous
            self._schema = self._state = None
            raise

    def setup(self) -> TableSchema:
        """Run the start-up checks once (``bind()`` runs them; direct use runs them lazily).

        Raises:
            ConfigurationError, RetryableError, MarkerMismatchError: as for ``bind()``.
        """
        if self._schema is None or self._state is None:
            self._start_up()
        assert self._schema is not None
        return self._schema

    def arrow_schema(self) -> pa.Schema:
        """The target's columns as the expected state records them (``arrow_types.py``)."""
        return target_arrow_schema(self.setup())

    def recovery_columns(self) -> dict[str, SinkColumn]:
        """Every column of the target as verify reads it: the write path checks the store by it."""
        return sink_columns(self.setup())

    def _start_up(self) -> None:
        what = self._what()
        conn = connect_checked(self.target, what, self.application_name)
        try:
            with conn:
                self._sessions.apply_settings(conn)
                self._check_server(conn)
                schema = open_target(
                    conn,
                    what=what,
                    schema_name=self.options.schema,
                    table=self.table,
                    key=self.options.key_columns,
                    append_only=self.options.append_only,
                    create_epoch_column=self.options.create_epoch_column,
                )
                state = StateTables(
                    open_state_schema(
                        conn,
                        explicit_schema=self.options.state_schema,
                        target_schema=schema.schema,
                        state_owner=self.options.state_owner,
                        what=what,
                    )
                )
                self._schema, self._state = schema, state
                self._ensured.clear()
                if self.pipeline is not None:
                    claim_scope(conn, state, self._scope(self.pipeline))
                    self._ensured.add(self.pipeline)
                    self._after_start_up(conn, self.pipeline)
        except psycopg.Error as err:
            self._schema = self._state = None
            raise startup_failure(self.target, what, err) from None
        except BaseException:
            self._schema = self._state = None
            raise

    def _check_server(self, conn: psycopg.Connection[Any]) -> None:
        """Mode-specific server requirements (none in transactional mode)."""

    def _after_start_up(self, conn: psycopg.Connection[Any], pipeline: str) -> None:
        """Mode-specific start-up reports (none in transactional mode)."""

    def _scope(self, pipeline: str) -> Scope:
        """The identity this sink's markers of ``pipeline`` carry."""
        assert self._schema is not None
        return Scope(
            pipeline,
            self._name,
            self._schema.schema,
            self._schema.table,
            None if self._writer is None else self._writer.log_id,
            None if self._writer is None else self._writer.decisions,
        )

    def _session(self) -> Session:
        """The idle session, or a new one; it is owned by the caller until released."""
        return self._sessions.take()

    def _release(self, session: Session) -> None:
        self._sessions.release(session)

    def close(self) -> None:
        """Close connections."""
        self._sessions.close()

    # -- shared steps -------------------------------------------------------

    def _check_txn(self, txn_id: SinkTxnId) -> Fatal | None:
        if txn_id.sink != self._name:
            return Fatal.of(
                ConfigurationError(
                    f"postgres sink {self._name!r} got txn {txn_id}, which belongs to another "
                    f"sink ({txn_id.sink!r}): each sink takes only its own txns"
                )
            )
        if self.pipeline not in (None, txn_id.pipeline):
            return Fatal.of(
                ConfigurationError(
                    f"postgres sink {self._name!r} is bound to pipeline {self.pipeline!r} but "
                    f"got txn {txn_id} of pipeline {txn_id.pipeline!r}"
                )
            )
        return None

    def _ensure_pipeline(self, session: Session, pipeline: str) -> None:
        """Claim the fence row of (pipeline, sink) once, outside any epoch txn.

        Raises:
            MarkerMismatchError: another progress log holds it.
        """
        if pipeline in self._ensured:
            return
        assert self._state is not None
        claim_fence_row(session.conn, self._state, self._scope(pipeline))
        self._ensured.add(pipeline)

    def _check_fence(
        self, cur: psycopg.Cursor[Any], txn_id: SinkTxnId, fence: Fence | None
    ) -> Fatal | None:
        """Reject a stale writer (or another state) inside the txn; take over if we are newer."""
        assert self._state is not None
        return check_epoch_fence(cur, self._state, self._scope(txn_id.pipeline), txn_id, fence)

    def fence(self, pipeline: str, generation: int, *, lock_timeout_ms: int = 5000) -> None:
        """Take over eagerly: raise the fence to ``generation`` now, not at the next epoch.

        From then on, a writer of an older generation is rejected inside its
        own txn. Waits (up to ``lock_timeout_ms``) for an older writer's open
        or prepared epoch txn, which holds the fence row locked.

        Raises:
            FencedError: a newer generation already holds the fence.
            MarkerMismatchError: another progress log holds the fence row.
            ConfigurationError, RetryableError: as for ``bind()``.
            psycopg.Error: the wait timed out or the connection failed (redacted).
        """
        self.setup()
        assert self._state is not None
        validate_name("pipeline", pipeline)
        with self.target.connect(autocommit=False, application_name=self.application_name) as c:
            take_over(c, self._state, self._scope(pipeline), generation, lock_timeout_ms)

    # -- errors ---------------------------------------------------------------

    def _outcome(self, err: ReconcileError) -> SinkOutcome:
        """The outcome that carries a typed error: retryable ones may pass, others stop."""
        if isinstance(err, RetryableError):
            return Retryable.of(err)
        return Fatal.of(err)

    def _connect_outcome(self, op: str, txn_id: SinkTxnId, err: psycopg.Error) -> SinkOutcome:
        """A failure to get a session: wrong credentials are Fatal, the rest Retryable."""
        if isinstance(err, psycopg.OperationalError) and not isinstance(
            err, errors.InsufficientPrivilege
        ):
            return self._outcome(
                connect_failure(self.target, err, f"postgres sink {self._name!r}, {op}({txn_id})")
            )
        return Retryable(self._describe_error(op, txn_id, err))

    def _rollback_quietly(self, session: Session) -> None:
        self._sessions.rollback_quietly(session)

    def _describe_error(self, op: str, txn_id: SinkTxnId, err: BaseException) -> str:
        table = self._schema.display if self._schema else self.table
        return describe_failure(self.target, self._name, table, op, txn_id, err)

    def _classify(self, op: str, txn_id: SinkTxnId, err: psycopg.Error) -> SinkOutcome:
        """Either way the txn was rolled back, so nothing of the epoch was written."""
        message = self._describe_error(op, txn_id, err) + "; nothing was written"
        table = self._schema.display if self._schema else self.table
        return classify_failure(message, err, epoch=txn_id.epoch, table=table, sink=self._name)
