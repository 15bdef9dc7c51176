"""Iceberg two-phase-commit sink: prepare writes the epoch's intent, commit makes ONE snapshot.

- ``stage`` buffers the epoch's changes in memory;
- ``prepare`` writes them as an intent file and records it in a table
  property, in one catalog commit that requires main unchanged
  (``sinks.iceberg.prepared``); a writer's first prepare also claims its
  generation (``sinks.iceberg.tokens`` explains the fence);
- ``commit`` turns the intent into ONE overwrite snapshot (the affected files
  rewritten, ``sinks.iceberg.rewrite``) whose summary names the epoch, and in
  the same metadata change raises the high-water mark and removes the record;
- ``abort`` removes the record, then the intent file;
- ``recover`` lists the records whose epoch no snapshot carries.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
from pyiceberg.catalog import Catalog
from pyiceberg.table import Table

from reconcile.core.contract import (
    OK,
    ConfigurationError,
    Fatal,
    InvalidInputError,
    Retryable,
    SinkOutcome,
    SinkTxnId,
    WriterIdentity,
    validate_name,
)
from reconcile.core.sink import SinkCapabilities
from reconcile.core.value_forms import with_refused
from sinks.changes import net_changes
from sinks.iceberg import prepared as records
from sinks.iceberg.fence import committed_outcome, fence_refusal, tidy
from sinks.iceberg.location import IcebergLocation, parse_uri
from sinks.iceberg.rows import (
    EPOCH_COLUMN,
    arrow_upserts,
    creation_schema,
    to_arrow,
)
from sinks.iceberg.tables import create_table, key_columns, load_table
from sinks.iceberg.tokens import SinkKeys
from sinks.iceberg.type_table import iceberg_refusal
from sinks.iceberg.writing import COMMIT_CHECKED, abort_record, commit_intent, record_intent
from sinks.ownership import WriterBinding

__all__ = ["COMMIT_CHECKED", "IcebergSink"]


class IcebergSink:
    """A TwoPhaseSink writing one Iceberg table, upserting and deleting by key.

    Args:
        name: the sink's name ([A-Za-z0-9_]).
        location: the table (an :class:`IcebergLocation`, or an ``iceberg://`` URI).
        schema: the rows' Arrow schema (without ``_epoch``) to create the table
            with; default: the table's, or inferred from the first upserted rows.
        key: the key columns; default: the location's, else the table's
            identifier fields.
    """

    def __init__(
        self,
        name: str,
        location: IcebergLocation | str,
        *,
        schema: pa.Schema | None = None,
        key: Sequence[str] | None = None,
    ) -> None:
        self._name = validate_name("sink", name)
        if isinstance(location, str):
            location = parse_uri(location, default_table=name)
        self.location = location
        self._schema = schema
        self._key = list(key) if key else list(location.key)
        self._catalog: Catalog | None = None
        self._staged: dict[tuple[str, str, int], list[Any]] = {}
        self._empty: set[tuple[str, str, int]] = set()  # prepared with no table and no schema
        self._binding = WriterBinding(f"Iceberg sink {self._name!r}")

    @property
    def name(self) -> str:
        """The sink's name."""
        return self._name

    @property
    def pipeline(self) -> str | None:
        """The pipeline of the writer it is bound to; None while unbound."""
        writer = self._binding.writer
        return None if writer is None else writer.pipeline

    @property
    def capabilities(self) -> SinkCapabilities:
        """Durable prepare (the record is in the catalog); pullable; rows carry ``_epoch``."""
        return SinkCapabilities(durable_prepare=True, epoch_column=True, pullable=True)

    @property
    def display(self) -> str:
        """The table in messages (``catalog.namespace.table``)."""
        return self.location.display()

    def __repr__(self) -> str:
        return f"IcebergSink(name={self._name!r}, table={self.display!r})"

    def catalog(self) -> Catalog:
        """The client's catalog (built on first use)."""
        if self._catalog is None:
            self._catalog = self.location.load_catalog()
        return self._catalog

    def table(self) -> Table | None:
        """The table at its newest metadata; None before it exists."""
        return load_table(self.catalog(), self.location)

    def key_columns(self, table: Table | None = None) -> list[str]:
        """The key columns (given, else the table's identifier fields)."""
        return key_columns(table if table is not None else self.table(), self._key, self.display)

    def arrow_schema(self) -> pa.Schema | None:
        """The rows' types without ``_epoch``: the table's, else ``schema=``; None before both."""
        table = self.table()
        schema = table.schema().as_arrow() if table is not None else self._schema
        if schema is None:
            return None
        held = pa.schema([f for f in schema if f.name != EPOCH_COLUMN])
        if table is None:
            return held
        # The columns of a type the engine cannot hold, named for the store to refuse
        # before anything is written (the type table, type_table.py).
        refused = {}
        for field in table.schema().fields:
            why = iceberg_refusal(field.field_type)
            if why is not None and field.name != EPOCH_COLUMN:
                refused[field.name] = why
        return with_refused(held, refused)

    def bind(self, writer: WriterIdentity) -> None:
        """Serve ``writer`` (idempotent); the catalog is reached now, so a bad one fails at start.

        Raises:
            ConfigurationError: another writer is bound, or the catalog cannot be loaded.
        """
        self._binding.bind(writer)
        self.table()

    # ------------------------------------------------------------------ contract

    def _check_txn(self, txn_id: SinkTxnId) -> Fatal | None:
        if txn_id.sink != self._name or self.pipeline not in (None, txn_id.pipeline):
            return Fatal.of(ConfigurationError(f"Iceberg sink {self._name!r} got txn {txn_id}"))
        return None

    def stage(self, txn_id: SinkTxnId, rows: Iterable[Any]) -> SinkOutcome:
        """Buffer ``rows`` (dicts, Changes or Arrow tables) for ``txn_id``, replacing any before."""
        if (bad := self._check_txn(txn_id)) is not None:
            return bad
        self._staged[txn_id.key] = [rows] if isinstance(rows, pa.Table) else list(rows)
        return OK

    @records.refuse_bad_record
    def prepare(self, txn_id: SinkTxnId) -> SinkOutcome:
        """Write the intent and record it (one catalog commit); claim the generation if newer."""
        if (bad := self._check_txn(txn_id)) is not None:
            return bad
        table = self.table()
        if table is not None:
            done = committed_outcome(table, txn_id, "prepare", self._binding, self.display)
            if done is not None:  # the epoch is in (OK), or in for another log (Fatal)
                self._staged.pop(txn_id.key, None)
                return done
            if (fenced := fence_refusal(table, txn_id, self.display, self._binding)) is not None:
                return fenced
        staged = self._staged.get(txn_id.key)
        if staged is None:
            if table is not None and records.read_record(table, SinkKeys.of(txn_id), txn_id.epoch):
                return OK  # prepared before (perhaps by a process that died)
            return Retryable(
                f"Iceberg sink {self._name!r}, {txn_id}: nothing staged in this process"
            )
        try:
            if table is None:
                keys = self.key_columns(None)
                declared = self._schema
                if declared is None and staged and isinstance(staged[0], pa.Table):
                    declared = staged[0].schema  # the first Arrow batch's types
                # Rows are read for their types only when nothing declares them.
                sample = [] if declared is not None else net_changes(staged, keys, self.display)[0]
                schema = creation_schema(declared, sample, keys, self.display)
                if schema is None:
                    # No table, no schema, no row to infer one from: nothing can
                    # change; the epoch needs no record (commit in this process).
                    self._empty.add(txn_id.key)
                    del self._staged[txn_id.key]
                    return OK
                table = create_table(self.catalog(), self.location, schema, keys)
            intent = self._intent(table, staged, txn_id.epoch)
        except (InvalidInputError, ConfigurationError) as exc:
            return Fatal(f"Iceberg sink {self._name!r}, {txn_id}: {exc}", exc)
        outcome = record_intent(self, table, txn_id, intent)
        if outcome:
            del self._staged[txn_id.key]
        return outcome

    def _intent(self, table: Table, staged: list[Any], epoch: int) -> pa.Table:
        keys = self.key_columns(table)
        schema = table.schema().as_arrow()
        key_schema = pa.schema([schema.field(k) for k in keys])
        if staged and all(isinstance(item, pa.Table) for item in staged):
            # Upserts as Arrow (a Spark batch, a big epoch): no trip through Python rows.
            fast = arrow_upserts(staged, schema, keys, self.display)
            if fast is not None:
                if EPOCH_COLUMN in schema.names:
                    index = schema.get_field_index(EPOCH_COLUMN)
                    epochs = pa.array([epoch] * fast.num_rows, schema.field(EPOCH_COLUMN).type)
                    fast = fast.set_column(index, schema.field(EPOCH_COLUMN), epochs)
                return records.with_ops(fast, key_schema.empty_table())
        upserts, deletes = net_changes(staged, keys, self.display)
        if EPOCH_COLUMN in schema.names:
            upserts = [{**row, EPOCH_COLUMN: epoch} for row in upserts]
        return records.with_ops(
            to_arrow(upserts, schema, self.display), to_arrow(deletes, key_schema, self.display)
        )

    @records.refuse_bad_record
    def commit(self, txn_id: SinkTxnId) -> SinkOutcome:
        """Make the prepared intent visible as ONE snapshot tagged with the txn's epoch."""
        if (bad := self._check_txn(txn_id)) is not None:
            return bad
        table = self.table()
        if table is None:
            if txn_id.key in self._empty:
                self._empty.discard(txn_id.key)
                return OK  # an empty epoch before the table exists: nothing to show
            return Fatal(f"Iceberg sink {self._name!r}, {txn_id}: commit of a txn that was "
                         f"never prepared (the table {self.display} does not exist)")  # fmt: skip
        return commit_intent(self, table, txn_id)

    @records.refuse_bad_record
    def abort(self, txn_id: SinkTxnId) -> SinkOutcome:
        """Remove the epoch's record (main required unchanged), then its intent file."""
        self._staged.pop(txn_id.key, None)
        self._empty.discard(txn_id.key)
        table = self.table()
        if table is None:
            return OK
        return abort_record(self, table, txn_id)

    def recover(self) -> Sequence[SinkTxnId]:
        """Txns recorded as prepared whose epoch no snapshot carries."""
        table = self.table()
        if table is None:
            return []
        stranded = []
        for record in records.prepared_records(table, self._name):
            if committed_outcome(table, record.txn, "recover", self._binding, self.display):
                tidy(table, record.txn)  # committed: a leftover record only
                continue
            stranded.append(record.txn)
        return sorted(stranded)

    def close(self) -> None:
        """Forget staged rows; close the catalog client's connections (a SQL catalog's pool)."""
        self._staged.clear()
        engine = getattr(self._catalog, "engine", None)
        if engine is not None:
            engine.dispose()

    def recovery_target(self, pipeline: str, generation: int | None, *, write: bool) -> Any:
        """This sink's table as a pull-and-diff target (``reconcile.recovery``)."""
        from sinks.iceberg.recovery import IcebergRecoveryTarget

        return IcebergRecoveryTarget(self, pipeline, generation, write=write)
