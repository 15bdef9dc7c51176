"""The on-disk layout of a store table: its columns, its file names and what a file holds."""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from pathlib import PurePosixPath

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]

from reconcile.core.contract import InvalidInputError

__all__ = [
    "EPOCH_COLUMN",
    "OP_COLUMN",
    "RESERVED_COLUMNS",
    "ROW_HASH_COLUMN",
    "TABLE_CONFIG",
    "TOMBSTONE_RETENTION",
    "StoreFile",
    "base_file_name",
    "change_file_name",
    "check_stored_schema",
    "classify",
    "merged_file_name",
    "state_schema",
    "stored_schema",
    "user_schema_of",
]

ROW_HASH_COLUMN = "_row_hash"
EPOCH_COLUMN = "_epoch"
OP_COLUMN = "_op"
RESERVED_COLUMNS = (ROW_HASH_COLUMN, EPOCH_COLUMN, OP_COLUMN)

# Table properties set at creation. Log cleanup by age is off: vacuum() prunes
# the log itself, below the oldest version it keeps, so every epoch that
# recovery may read stays reachable by time travel and no other. Checkpoints
# bound the JSON replay that each small epoch's commit and refresh pay (~0.2 ms
# more per commit since the last checkpoint), but the commit that writes one
# costs ~15 ms more CPU: so maintain() writes them between epochs, every 10
# commits, and delta-rs' own, inside a commit, comes only every 100 versions, as a
# backstop for a table nobody maintains. Removed files stay in checkpoints as
# tombstones for TOMBSTONE_RETENTION, not delta-rs' week.
TABLE_CONFIG = {
    "delta.enableExpiredLogCleanup": "false",
    "delta.checkpointInterval": "100",
    "delta.deletedFileRetentionDuration": "interval 5 minutes",
}
# Every compaction removes files (a file per merged epoch), and every live
# tombstone is carried by every checkpoint and held by every open snapshot: an
# hour of them at tens of epochs a second (a catch-up after an outage) is tens of
# thousands, which made RSS grow by ~15 % and the loop 1.7x slower (80,000
# tombstones, measured). The store's vacuum() lists the files itself (full mode)
# and needs none; only a VACUUM by another tool, run with the table's default
# retention, would delete removed files sooner, and one run with any retention
# shorter than the store's keep_from_epoch window is unsafe anyway.
TOMBSTONE_RETENTION = TABLE_CONFIG["delta.deletedFileRetentionDuration"]

# File names carry what the file is, so that the write path and the readers
# classify the live files of a snapshot from the file list alone, without
# opening a file or parsing statistics:
#   change-e<epoch>-<uuid>.parquet         one epoch's changes (upserts and tombstones)
#   change-e<first>-e<last>-<uuid>.parquet the changes of epochs first..last merged: the
#                                          newest change of each key, tombstones kept
#   base-t<through>-<uuid>-<n>.parquet     the compacted base, folded through epoch <through>
_CHANGE = re.compile(r"^change-e(\d{12})-[0-9a-f]{32}\.parquet$")
_MERGED = re.compile(r"^change-e(\d{12})-e(\d{12})-[0-9a-f]{32}\.parquet$")
_BASE = re.compile(r"^base-t(\d{12})-[0-9a-f]{32}-\d{4}\.parquet$")


@dataclass(frozen=True, slots=True)
class StoreFile:
    """One live data file of a store table, classified by its name.

    Attributes:
        uri: where to read it (as deltalake lists it).
        path: its path relative to the table root.
        kind: "change" (the changes of one epoch, or of merged epochs) or "base".
        epoch: the change file's (last) epoch, or the epoch the base was folded through.
        size: its size in bytes.
        first: a change file's first epoch (``epoch`` for one epoch's file).
        rows: its row count as its log entry records it (None: not recorded).
    """

    uri: str
    path: str
    kind: str
    epoch: int
    size: int
    first: int = -1
    rows: int | None = None

    @property
    def merged(self) -> bool:
        """Whether this is a change file of several epochs merged."""
        return self.kind == "change" and self.first != self.epoch


def change_file_name(epoch: int) -> str:
    """A new, unique name for epoch ``epoch``'s change file."""
    return f"change-e{epoch:012d}-{uuid.uuid4().hex}.parquet"


def merged_file_name(first: int, last: int) -> str:
    """A new, unique name for the merged changes of epochs ``first..last``."""
    return f"change-e{first:012d}-e{last:012d}-{uuid.uuid4().hex}.parquet"


def base_file_name(through: int, tag: str, part: int) -> str:
    """The name of part ``part`` of a base folded through ``through`` (``tag``: a uuid hex)."""
    return f"base-t{through:012d}-{tag}-{part:04d}.parquet"


def classify(uri: str, path: str, size: int, *, table: str) -> StoreFile:
    """Classify a live file by its name.

    Raises:
        InvalidInputError: the file was not written by the store (naming it):
            merge-on-read cannot place its rows, so nothing is guessed.
    """
    name = PurePosixPath(path).name
    match = _CHANGE.match(name)
    if match:
        epoch = int(match.group(1))
        return StoreFile(uri, path, "change", epoch, size, first=epoch)
    match = _MERGED.match(name)
    if match:
        first, last = int(match.group(1)), int(match.group(2))
        return StoreFile(uri, path, "change", last, size, first=first)
    match = _BASE.match(name)
    if match:
        return StoreFile(uri, path, "base", int(match.group(1)), size)
    raise InvalidInputError(
        f"table {table!r}: file {path!r} was not written by the expected-state store "
        "(neither a change file nor a base file); the table cannot be read as a store table",
        table=table,
        file=path,
    )


def stored_schema(user: pa.Schema, keys: list[str]) -> pa.Schema:
    """The Delta table's schema: keys, values (nullable: tombstones hold none), hash, epoch, op."""
    fields = [f if f.name in keys else f.with_nullable(True) for f in user]
    return pa.schema(
        [
            *fields,
            pa.field(ROW_HASH_COLUMN, pa.int64(), nullable=True),
            pa.field(EPOCH_COLUMN, pa.int64(), nullable=False),
            pa.field(OP_COLUMN, pa.string(), nullable=False),
        ]
    )


def state_schema(user: pa.Schema) -> pa.Schema:
    """The schema of a snapshot: keys, values, ``_row_hash``, ``_epoch`` (no ``_op``)."""
    return user.append(pa.field(ROW_HASH_COLUMN, pa.int64(), nullable=False)).append(
        pa.field(EPOCH_COLUMN, pa.int64(), nullable=False)
    )


def user_schema_of(stored: pa.Schema) -> pa.Schema:
    """The user columns (keys and values) of a stored schema."""
    return pa.schema([f for f in stored if f.name not in RESERVED_COLUMNS])


def check_stored_schema(stored: pa.Schema, *, table: str) -> None:
    """Refuse a table that lacks the merge-on-read columns (e.g. an older layout).

    Raises:
        InvalidInputError: naming the table and the missing column.
    """
    for column in RESERVED_COLUMNS:
        if stored.get_field_index(column) < 0:
            raise InvalidInputError(
                f"table {table!r} has no {column!r} column: it is not a merge-on-read store "
                "table (it may have been written by an older layout); nothing was written",
                table=table,
                column=column,
            )
