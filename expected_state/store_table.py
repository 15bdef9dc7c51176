"""The expected-state store's table: its name, opening it, its schema, its tokens, the claim.

:class:`StoreTable` is what every part of :class:`~expected_state.store.ExpectedStateStore`
works on: the Delta table of one (pipeline, sink table), opened lazily and
kept up to date incrementally, the user schema it stores, the epoch token and
the writer's fence read from a snapshot, and ``claim`` (taking over as the
writer). The store's write path (``expected_state.store``) and its readers,
revert, compaction and housekeeping build on it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from expected_state.delta_commit import BasedOn, DeltaCommit, commit_files, make_durable
from expected_state.delta_log import transaction_version
from expected_state.epochs import EpochLog
from expected_state.fencing import check_generation, fence_app_id, validate_generation
from expected_state.integrity import ENGINE_APP_KEY, LogAudit
from expected_state.layout import (
    TABLE_CONFIG,
    check_stored_schema,
    stored_schema,
    user_schema_of,
)
from expected_state.protocol import create_config, list_invariants
from expected_state.refusals import store_refusal
from reconcile.core.contract import InvalidInputError, validate_name
from reconcile.core.keys import check_arrow_keys

__all__ = ["StoreTable"]


class StoreTable:
    """The Delta table of one sink table of one pipeline, as the store reads and claims it.

    See :class:`~expected_state.store.ExpectedStateStore` for the layout.
    """

    def __init__(
        self,
        root: str,
        pipeline: str,
        sink: str,
        key_columns: Sequence[str],
        *,
        schema: pa.Schema | None = None,
        generation: int = 0,
        column_types: pa.Schema | None = None,
    ) -> None:
        """Open (lazily) the store table of ``pipeline``/``sink``.

        Args:
            root: the store root, a local path or a URI deltalake understands.
            pipeline: pipeline name ([A-Za-z0-9_]).
            sink: sink table name ([A-Za-z0-9_]).
            key_columns: the key columns, in order.
            schema: the user schema (keys + values); default: the existing table's,
                or inferred from the first epoch's upserts.
            generation: this writer's fencing generation; call :meth:`claim` to take over.
            column_types: the sink table's column types, which a schema inferred
                from the first epoch takes (``expected_state.column_types``).

        Raises:
            ConfigurationError: a bad name.
            InvalidInputError: no key columns, or keys not in ``schema``.
        """
        self.root = str(root).rstrip("/")
        self.pipeline = validate_name("pipeline", pipeline)
        self.sink = validate_name("sink", sink)
        self.uri = f"{self.root}/{pipeline}/{sink}"
        self.app_id = f"{pipeline}/{sink}"
        self.key_columns = list(key_columns)
        if not self.key_columns:
            raise InvalidInputError(f"table {self.uri!r}: at least one key column is needed")
        self.generation = validate_generation(generation)
        self.epochs = EpochLog(self.root, pipeline, sink, generation=generation)
        self._fence = fence_app_id(pipeline, sink)
        self._table: DeltaTable | None = None
        self._schema: pa.Schema | None = schema
        self.column_types = column_types
        self._versions: dict[int, int] = {}
        self._epoch_files: dict[int, list[str]] = {}
        self._versions_upto = -1
        self._history_from = 0
        # What was checked before rows were trusted (expected_state.trust).
        self._log_audit: LogAudit | None = None
        self._sound_files: set[str] = set()
        if schema is not None:
            missing = [k for k in self.key_columns if k not in schema.names]
            if missing:
                raise InvalidInputError(
                    f"table {self.uri!r}: key column {missing[0]!r} is not in the schema "
                    f"{schema.names}",
                    table=self.uri,
                    column=missing[0],
                )
            check_arrow_keys(f"table {self.uri!r}", schema, self.key_columns)

    # -- opening ---------------------------------------------------------------

    def _delta(self, *, refresh: bool = True) -> DeltaTable | None:
        """The state table at its newest version (cached, updated incrementally)."""
        if self._table is None:
            try:
                table = DeltaTable(self.uri)
            except TableNotFoundError:
                return None
            stored = pa.schema(table.schema().to_arrow())
            check_stored_schema(stored, table=self.uri)
            self._table = table
            # An existing table's schema is its own: a schema given (``schema=``)
            # that differs is a change that the commit cycle plans and evolves
            # (``reconcile.core.schema_change``), never one taken silently.
            self._schema = user_schema_of(stored)
        elif refresh:
            self._table.update_incremental()
        return self._table

    @property
    def user_schema(self) -> pa.Schema | None:
        """Key and value columns, as stored (None before the first epoch)."""
        self._delta()
        return self._schema

    def _stored_schema(self, user: pa.Schema) -> pa.Schema:
        return stored_schema(user, self.key_columns)

    def _create(self, user: pa.Schema) -> DeltaTable:
        """Create the table if absent (``ignore``: a concurrent creator wins harmlessly)."""
        # The first epoch may be what gives the schema: its key types are
        # checked here, before anything is written.
        check_arrow_keys(f"table {self.uri!r}", user, self.key_columns)
        try:
            stored = self._stored_schema(user)
            DeltaTable.create(
                self.uri, stored, mode="ignore", configuration=create_config(stored, TABLE_CONFIG)
            )
        except Exception as exc:
            refused = store_refusal(exc, table=self.uri, what="a table of these columns")
            if refused is None:
                raise
            raise refused from None
        make_durable(self.uri, 0, 0)
        table = self._delta()
        assert table is not None
        return table

    def _tokens(self, table: DeltaTable) -> tuple[int | None, int | None]:
        """The epoch token and the fence on ``table``'s snapshot.

        At the version of this object's own last apply() commit both are known
        (``remember_written``: that commit wrote them), and not read back.
        """
        return transaction_version(table, self.app_id), transaction_version(table, self._fence)

    def _token(self, table: DeltaTable) -> int | None:
        """The newest applied epoch on ``table``'s snapshot (a revert of the first: -1, None)."""
        token = self._tokens(table)[0]
        return None if token is None or token < 0 else token

    def claim(self) -> None:
        """Take over as the writer: record this generation in the state and epochs tables.

        Raises:
            FencedError: a newer generation has already taken over.
        """
        table = self._delta()
        if table is None:
            if self._schema is None:
                raise InvalidInputError(
                    f"table {self.uri!r}: claim() before the first epoch needs schema=",
                    table=self.uri,
                )
            table = self._create(self._schema)
        check_generation(table, self._fence, self.generation, table_name=self.uri)
        # A table an older engine created with a timestamp without a zone lacks
        # `invariants`, and delta-spark refuses it: listed once, by the writer
        # that holds the fence (a zombie was refused just above).
        base = table.version()
        if list_invariants(table, {ENGINE_APP_KEY: self._fence}):
            table.update_incremental()
            make_durable(self.uri, base + 1, table.version())
        if transaction_version(table, self._fence) != self.generation:
            assert self._schema is not None
            # Fenced on the snapshot the claim commits on: a claim never lowers the fence.
            claim = DeltaCommit(
                table_uri=self.uri,
                schema=self._stored_schema(self._schema),
                app_id=self._fence,
                version=self.generation,
                fence=(self._fence, self.generation),
            )
            commit_files(claim, BasedOn(table))
        self.epochs.claim()

    def last_epoch(self) -> int | None:
        """The newest epoch applied (from the state table's own log), or None."""
        table = self._delta()
        return None if table is None else self._token(table)

    def _describe(self) -> dict[str, Any]:
        return {"uri": self.uri, "pipeline": self.pipeline, "sink": self.sink}
