"""An epoch recorded in parts: change files written by Spark executors, added in one commit.

The streaming writer has each executor task net its partition's rows (one
change per key; the partitions are split by key, so no key is in two of them)
and write them as one change file of the epoch with :class:`PartWriter`. The
driver then adds every kept task's file in ONE tokened, fenced Delta commit
(:meth:`Parts.apply_parts`), exactly as ``apply`` adds its one file: the epoch
is recorded whole or not at all, and a file of a failed task attempt, never
named, stays invisible until ``vacuum`` deletes it.

Readers need nothing new: several change files of one epoch hold distinct
keys, so merge-on-read gives the same state in any order, and revert removes
every file of the epoch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
from deltalake import DeltaTable

from expected_state.changes import EpochChanges, change_rows, normalize_changes
from expected_state.column_types import infer_user_schema
from expected_state.delta_files import DataFile, describe_data_file, write_data_file
from expected_state.fencing import check_recorded_generation
from expected_state.layout import OP_COLUMN, change_file_name, stored_schema
from reconcile.core.contract import InvalidInputError

if TYPE_CHECKING:
    from expected_state.store import ApplyResult

__all__ = ["PartWriter", "Parts"]


@dataclass(frozen=True)
class PartWriter:
    """What an executor needs to write change files of one store table (it pickles).

    Attributes:
        uri: the store table's root.
        keys: its key columns.
        user_schema: its key and value columns, as the table stores them.
        column_types: the sink's column types (named in errors beside the store's).
    """

    uri: str
    keys: tuple[str, ...]
    user_schema: pa.Schema
    column_types: pa.Schema | None = None

    def net(self, rows: pa.Table) -> EpochChanges:
        """A partition's rows (upserts, or with ``_op``) as one change per key.

        Raises:
            InvalidInputError: a column or type the table does not have, a NULL
                key (naming the table and the column).
        """
        if OP_COLUMN not in rows.column_names:
            rows = rows.append_column(OP_COLUMN, pa.repeat(pa.scalar("upsert"), rows.num_rows))
        net, _ = normalize_changes(
            rows, keys=self.keys, schema=self.user_schema, table=self.uri, types=self.column_types
        )
        return net

    def write(self, epoch: int, net: EpochChanges) -> str | None:
        """Write the net changes as one change file of ``epoch``; its path, or None if empty."""
        schema = stored_schema(self.user_schema, list(self.keys))
        rows = change_rows(net, self.user_schema, schema, self.keys, epoch)
        if not rows.num_rows:
            return None
        return write_data_file(self.uri, change_file_name(epoch), rows).path


class Parts:
    """Mixin for :class:`~expected_state.store.ExpectedStateStore`: epochs written in parts."""

    uri: str
    key_columns: list[str]
    generation: int
    column_types: pa.Schema | None
    _schema: pa.Schema | None

    def _delta(self, *, refresh: bool = True) -> DeltaTable | None:  # provided by the store
        raise NotImplementedError

    def _create(self, user: pa.Schema) -> DeltaTable:  # provided by the store
        raise NotImplementedError

    def _already_applied(self, table: DeltaTable, epoch: int, *, allow_gap: bool) -> bool:
        raise NotImplementedError  # provided by the store

    def _tokens(self, table: DeltaTable) -> tuple[int | None, int | None]:
        raise NotImplementedError  # provided by the store

    def _commit_epoch(
        self,
        table: DeltaTable,
        epoch: int,
        adds: list[DataFile],
        schema: pa.Schema,
        *,
        upserted: int,
        deleted: int,
        allow_gap: bool,
        check_schema: bool = False,
    ) -> ApplyResult:
        raise NotImplementedError  # provided by the store

    def part_writer(self, user_schema: pa.Schema) -> PartWriter:
        """The writer for executors, creating the table first if it has no epoch yet.

        Args:
            user_schema: the columns the executors will write (keys first);
                checked against the table's when it has one.

        Raises:
            InvalidInputError: a column missing or of another type than the
                table's (naming it); nothing was written.
        """
        table = self._delta()
        if table is None or self._schema is None:
            # As apply() infers a first epoch's schema: keys first, the sink's
            # types where it has them, else the frame's, widened.
            schema = self._schema or infer_user_schema(
                user_schema, self.key_columns, self.column_types, table=self.uri
            )
            self._create(schema)
        assert self._schema is not None
        writer = PartWriter(self.uri, tuple(self.key_columns), self._schema, self.column_types)
        writer.net(user_schema.empty_table())  # the same check a part makes, before any runs
        return writer

    def apply_parts(
        self,
        epoch: int,
        paths: Sequence[str],
        *,
        upserted: int,
        deleted: int,
        allow_gap: bool = False,
    ) -> ApplyResult:
        """Record ``epoch`` as the change files executors wrote, in ONE tokened commit.

        Args:
            epoch: the epoch.
            paths: the files (relative to the table root) of the task attempts
                Spark kept; written by :class:`PartWriter` for this epoch.
            upserted, deleted: their net changes, as the tasks counted them.
            allow_gap: as for ``apply``.

        Raises:
            EpochOrderError, FencedError, RetryableError, OutcomeUnknownError: as ``apply``.
            InvalidInputError: the table does not exist (``part_writer`` creates
                it), or a file is not of the table's schema (naming it).
        """
        from expected_state.store import ApplyResult

        table = self._delta()
        if table is None or self._schema is None:
            raise InvalidInputError(
                f"table {self.uri!r}: no store table to add epoch {epoch}'s files to "
                "(part_writer() creates it before executors write); nothing was written",
                table=self.uri,
                epoch=epoch,
            )
        if self._already_applied(table, epoch, allow_gap=allow_gap):
            return ApplyResult(epoch, applied=False, table_version=None)
        check_recorded_generation(self._tokens(table)[1], self.generation, table_name=self.uri)
        adds = [describe_data_file(self.uri, p) for p in paths]
        return self._commit_epoch(
            table,
            epoch,
            adds,
            stored_schema(self._schema, self.key_columns),
            upserted=upserted,
            deleted=deleted,
            allow_gap=allow_gap,
            check_schema=True,
        )
