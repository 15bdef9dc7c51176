"""An epoch recorded in parts: change files written by Spark executors, added in one commit.

The streaming writer has each executor task net its partition's rows (one
change per key; the partitions are split by key, so no key is in two of them)
and write them as one change file of the epoch with the :class:`PartWriter`
that ``ExpectedStateStore.part_writer`` hands out. The driver then adds every
kept task's file in ONE tokened, fenced Delta commit
(``ExpectedStateStore.apply_parts``), exactly as ``apply`` adds its one file:
the epoch is recorded whole or not at all, and a file of a failed task attempt,
never named, stays invisible until ``vacuum`` deletes it.

Readers need nothing new: several change files of one epoch hold distinct
keys, so merge-on-read gives the same state in any order, and revert removes
every file of the epoch.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]

from expected_state.changes import EpochChanges, change_rows, normalize_changes
from expected_state.delta_files import write_data_file
from expected_state.layout import OP_COLUMN, change_file_name, stored_schema

__all__ = ["PartWriter"]


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

    def write(
        self, epoch: int, net: EpochChanges, row_hashes: pa.ChunkedArray | None = None
    ) -> str | None:
        """Write the net changes as one change file of ``epoch``; its path, or None if empty.

        ``row_hashes``: the upserts' canonical row hashes where Spark computed
        them (see ``change_rows``).
        """
        schema = stored_schema(self.user_schema, list(self.keys))
        rows = change_rows(net, self.user_schema, schema, self.keys, epoch, row_hashes)
        if not rows.num_rows:
            return None
        return write_data_file(self.uri, change_file_name(epoch), rows).path
