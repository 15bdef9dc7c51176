"""An epoch's change file, written ahead of the one commit that makes it part of the table.

An epoch becomes visible in the store in one tokened, fenced Delta commit
(``ExpectedStateStore.apply``). What comes before that commit needs nothing
of the table's log: the stored rows (the row hash of every upsert, a
tombstone for every delete) and the Parquet file that holds them. Written
ahead, while the sinks stage and prepare the same epoch, that work is off
the commit point; the commit then checks the epoch's order and the fence on
a fresh snapshot, as it always does, and adds the file.

A file written ahead is invisible to every reader until that commit names
it. If the epoch is aborted it is removed; if the process dies first it is an
orphan that no version references, which ``vacuum(full=True)`` removes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]

from expected_state.changes import EpochChanges, change_rows
from expected_state.delta_commit import DataFile
from expected_state.delta_files import filesystem, write_data_file
from expected_state.layout import change_file_name

__all__ = ["EpochFile", "remove_epoch_file", "write_epoch_file"]


@dataclass(frozen=True)
class EpochFile:
    """An epoch's changes and the change file that holds them, not yet committed.

    ``files`` is empty when the epoch has no row for the table (nothing to add).
    """

    epoch: int
    net: EpochChanges
    files: tuple[DataFile, ...]


def write_epoch_file(
    uri: str, epoch: int, net: EpochChanges, keys: Sequence[str], stored: pa.Schema
) -> EpochFile:
    """Write ``epoch``'s stored rows as one new change file under the table at ``uri``.

    Args:
        uri: the store table's root.
        epoch: the epoch the rows are stamped with (``_epoch``).
        net: the epoch's changes, one per key, in the table's user schema.
        keys: the key columns.
        stored: the table's stored schema (user columns, ``_row_hash``,
            ``_epoch``, ``_op``).
    """
    rows = change_rows(net, net.upserts.schema, stored, keys, epoch)
    if not rows.num_rows:
        return EpochFile(epoch, net, ())
    return EpochFile(epoch, net, (write_data_file(uri, change_file_name(epoch), rows),))


def remove_epoch_file(uri: str, written: EpochFile) -> None:
    """Remove a file written ahead whose epoch was aborted (best effort: vacuum does the rest)."""
    fs, root = filesystem(uri)
    for data in written.files:
        # What cannot be removed is an orphan no version names: vacuum(full=True) removes it.
        with contextlib.suppress(OSError):
            fs.delete_file(f"{root}/{data.path}")
