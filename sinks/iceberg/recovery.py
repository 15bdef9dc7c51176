"""Pull-and-diff on an Iceberg table: a snapshot scanned into Arrow, a repair in ONE snapshot.

The pull reads the snapshot that was current when it began (every later
commit is invisible to it), the expected state's columns only, batch by batch
(``to_arrow_batch_reader``: bounded memory). Scoped mode reads the files whose
column bounds may hold a staged key or an ``_epoch`` past the sink's newest
verified epoch. Buckets mode needs checksums computed by the sink's system;
Iceberg has none, and this says so.

The repair is one overwrite snapshot (``sinks.iceberg.rewrite``), committed
with the catalog's requirements that main is still the snapshot whose fence
and newest epoch it read: it raises the high-water mark to the target epoch
and its summary stands for the epochs after the newest one (the markers the
other sinks write one row each for).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
import pyarrow.compute as pc  # type: ignore[import-untyped, unused-ignore]
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.expressions import AlwaysTrue, BooleanExpression, Or
from pyiceberg.table import Table
from pyiceberg.table.update import SetPropertiesUpdate
from pyiceberg.types import IcebergType

from reconcile.core.conform import SinkColumn
from reconcile.core.contract import FencedError, InvalidInputError, SinkTxnId
from reconcile.core.target import NoRowChecksums, Progress, Repair
from sinks.iceberg.expressions import above, one_of
from sinks.iceberg.rewrite import plan_rewrite, stage_snapshot
from sinks.iceberg.rows import EPOCH_COLUMN
from sinks.iceberg.tokens import (
    KIND_REPAIR,
    SinkKeys,
    commit_once,
    epoch_summary,
    int_property,
    new_transaction,
)
from sinks.iceberg.type_table import iceberg_kind

if TYPE_CHECKING:
    from sinks.iceberg.sink import IcebergSink

__all__ = ["IcebergRecoveryTarget", "sink_kind"]


def sink_kind(typ: IcebergType) -> str:
    """The recovery kind of an Iceberg column type (the type table, ``type_table.py``)."""
    return iceberg_kind(typ)


class _Snapshot(NoRowChecksums):
    """One Iceberg snapshot of the table (the protocol ``SinkSnapshot``)."""

    system = "Iceberg"
    target: IcebergRecoveryTarget

    def __init__(self, target: IcebergRecoveryTarget, table: Table, schema: pa.Schema,
                 keys: list[str]) -> None:  # fmt: skip
        self.target, self.table, self.schema, self.keys = target, table, schema, keys
        sink_keys = SinkKeys(target.pipeline, target.sink.name)
        self.newest_epoch = int_property(table, sink_keys.epoch)
        self.warnings: list[str] = []
        # Files are pruned by column bounds, never read by a key range's index.
        self.narrow_ranges = False

    def _scan(self, row_filter: BooleanExpression) -> Any:
        return self.table.scan(row_filter=row_filter, selected_fields=tuple(self.schema.names))

    def _empty(self) -> pa.Table:
        return self.table.schema().as_arrow().empty_table().select(self.schema.names)

    def pull_all(self, progress: Progress | None) -> pa.Table:
        """Every row of the snapshot, the expected state's columns (the table's own types)."""
        parts: list[pa.Table] = []
        self.pull_each(parts.append, progress)
        return pa.concat_tables(parts) if parts else self._empty()

    def pull_each(self, each: Callable[[pa.Table], None], progress: Progress | None) -> None:
        """Every row, handed to ``each`` a batch at a time (one file's batches in memory)."""
        if self.table.metadata.current_snapshot_id is None:
            return
        pulled = 0
        for batch in self._scan(AlwaysTrue()).to_arrow_batch_reader():
            if batch.num_rows:
                each(pa.Table.from_batches([batch]))
                pulled += batch.num_rows
                if progress is not None:
                    progress(pulled, self.estimated_rows())

    def estimated_rows(self) -> int | None:
        """The snapshot summary's ``total-records`` (minus deletes written by other engines)."""
        snapshot = self.table.current_snapshot()
        if snapshot is None or snapshot.summary is None:
            return 0 if snapshot is None else None
        total = snapshot.summary.get("total-records")
        return None if total is None else int(total)

    def pull_keys(self, keys: pa.Table, newer_than: int) -> pa.Table:
        """The rows of the staged keys, and the rows whose ``_epoch`` is past ``newer_than``."""
        if not self.target.epoch_column:
            raise InvalidInputError(
                f"table {self.target.display} has no {EPOCH_COLUMN} column, which scoped mode "
                "needs; use mode full",
                table=self.target.display,
            )
        if self.table.metadata.current_snapshot_id is None:
            return self._empty()
        first = self.keys[0]
        later: BooleanExpression = above(EPOCH_COLUMN, newer_than)
        values = set(pc.unique(keys.column(first).combine_chunks()).to_pylist())
        # The files are pruned by bounds; the rows are then taken exactly.
        rows = self.table.scan(row_filter=Or(one_of(first, values), later) if values else later)
        rows = rows.to_arrow()
        rows = rows.append_column("__row", pa.array(range(rows.num_rows), pa.int64()))
        wanted = pc.fill_null(pc.greater(rows.column(EPOCH_COLUMN), newer_than), False)
        if keys.num_rows:
            typed = keys.select(self.keys).cast(
                pa.schema([rows.schema.field(k) for k in self.keys])
            )
            matched = rows.select([*self.keys, "__row"]).join(
                typed, self.keys, join_type="left semi"
            )
            wanted = pc.or_(
                wanted, pc.is_in(rows.column("__row"), value_set=matched.column("__row"))
            )
        rows = rows.filter(wanted)
        return rows.select(self.schema.names)

    def count_rows(self) -> int:
        """The rows of the snapshot (what the mass-change brake weighs)."""
        if self.table.metadata.current_snapshot_id is None:
            return 0
        return int(self._scan(AlwaysTrue()).count())


class IcebergRecoveryTarget:
    """The ``RecoveryTarget`` of one Iceberg table (see ``IcebergSink``)."""

    bucket_checksums = False

    def __init__(
        self, sink: IcebergSink, pipeline: str, generation: int | None, *, write: bool
    ) -> None:
        self.sink, self.pipeline, self.generation, self.write = sink, pipeline, generation, write

    def _table(self) -> Table:
        table = self.sink.table()
        if table is None:
            raise InvalidInputError(
                f"Iceberg table {self.display} does not exist; nothing was pulled or written",
                table=self.display,
            )
        return table

    @property
    def display(self) -> str:
        return self.sink.display

    @property
    def epoch_column(self) -> bool:
        return EPOCH_COLUMN in self._table().schema().as_arrow().names

    def columns(self) -> dict[str, SinkColumn]:
        return {
            f.name: SinkColumn(f.name, sink_kind(f.field_type), str(f.field_type))
            for f in self._table().schema().fields
        }

    def key_columns(self) -> list[str]:
        return self.sink.key_columns()

    @contextmanager
    def snapshot(self, schema: pa.Schema, keys: list[str]) -> Iterator[_Snapshot]:
        # A loaded Table is pinned to its metadata: its scans read that
        # snapshot, whatever commits after.
        yield _Snapshot(self, self._table(), schema, keys)

    def apply(self, repair: Repair) -> int | None:
        """The repair as ONE snapshot, main required unchanged since the fence was read.

        Returns None (nothing written) if the sink's newest epoch moved since
        the pull, or another commit came first: the caller pulls again.

        Raises:
            FencedError: a newer writer generation holds the table.
            InvalidInputError: the target epoch is older than the sink's newest.
        """
        table = self._table()
        keys = SinkKeys(self.pipeline, self.sink.name)
        properties = table.metadata.properties
        fence = int_property(table, keys.generation)
        if self.generation is not None and fence is not None and fence > self.generation:
            raise FencedError(
                f"Iceberg sink {self.sink.name!r} ({self.display}): generation "
                f"{self.generation} is fenced off by {fence}; nothing was written",
                generation=self.generation,
                fence=fence,
            )
        newest = int_property(table, keys.epoch)
        if newest != repair.seen_newest:
            return None
        target = repair.target_epoch
        if newest is not None and target < newest:
            raise InvalidInputError(
                f"Iceberg sink {self.sink.name!r}: cannot repair to epoch {target}, older than "
                f"the sink's newest epoch ({newest}); nothing was written"
            )
        # Whose epochs the repair stands for: the writer's that runs it, or, for an
        # operator's repair, the newest commit's (none yet: it stands for none).
        owner = (
            self.sink._binding.log_id
            if self.generation is not None
            else properties.get(keys.log_id)
        )
        advances = (self.generation is not None or owner is not None) and (
            newest is None or newest < target
        )
        upserts, deletes = self._changes(table, repair)
        if not upserts.num_rows and not deletes.num_rows and not advances:
            return 0
        rewrite = plan_rewrite(table, upserts, deletes, self.sink.key_columns(table))
        generation = self.generation if self.generation is not None else (fence or 0)
        txn = SinkTxnId(self.pipeline, self.sink.name, target, generation)
        summary = epoch_summary(txn, owner, kind=KIND_REPAIR,
                                first_epoch=target if newest is None else newest + 1)  # fmt: skip
        if not advances:
            del summary["reconcile.epoch"]  # rows only: it stands for no epoch
        summary["reconcile.repair-id"] = str(uuid.uuid4())
        summary["reconcile.mode"] = repair.mode
        summary.update({f"reconcile.{k}": str(v) for k, v in repair.counts.items()})
        transaction = new_transaction(table)
        stage_snapshot(transaction, rewrite, summary)
        updates = {keys.epoch: str(target)} if advances else {}
        if self.generation is not None:
            updates[keys.generation] = str(max(fence or 0, self.generation))
        try:
            commit_once(table, transaction, (SetPropertiesUpdate(updates=updates),))
        except CommitFailedException:
            return None  # another commit came first: nothing was written; pull again
        return int(upserts.num_rows + deletes.num_rows)

    def _changes(self, table: Table, repair: Repair) -> tuple[pa.Table, pa.Table]:
        """The repair's upserts in the table's types (``_epoch`` = the target) and its deletes."""
        schema = table.schema().as_arrow()
        rows = repair.upserts
        columns = []
        for field in schema:
            if field.name == EPOCH_COLUMN:
                columns.append(pa.array([repair.target_epoch] * rows.num_rows, field.type))
            elif field.name in rows.column_names:
                columns.append(rows.column(field.name).cast(field.type))
            else:
                columns.append(pa.nulls(rows.num_rows, field.type))
        upserts = pa.Table.from_arrays(columns, schema=schema)
        keys = self.sink.key_columns(table)
        deletes = repair.deletes.select(keys).cast(pa.schema([schema.field(k) for k in keys]))
        return upserts, deletes

    def close(self) -> None:
        self.sink.close()
