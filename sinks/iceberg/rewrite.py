"""Upserts and deletes by key in ONE Iceberg snapshot: the affected data files rewritten.

Why copy-on-write, not equality deletes: pyiceberg (0.12) writes no delete
files at all, neither equality nor position deletes (a table set to
merge-on-read falls back to copy-on-write with a warning). Its own
``Table.upsert``, ``overwrite(overwrite_filter=...)`` and ``delete(filter)``
rewrite files too, but each stages a delete snapshot and an append snapshot
(so an epoch would be two or three snapshots), and they commit with pyiceberg's
retries, which re-base a failed commit and lose the fence's requirement.

Here one ``overwrite`` snapshot does it all: the data files that may hold an
affected key (found by the manifests' column bounds) are read, the ones that
really hold one are removed, their other rows are written again with the
epoch's upserts, and the snapshot removes and adds those files at once. A
reader sees the table before the epoch or after it, never between.

The cost follows the files the epoch's keys touch, not the table: keys that
arrive in order (or a table sorted by key) touch few files. A table written
by another engine with position deletes is read with them applied; the data
file and its deletes are then replaced by the rewritten file.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
import pyarrow.compute as pc  # type: ignore[import-untyped, unused-ignore]
from pyiceberg.expressions import AlwaysTrue, And, BooleanExpression
from pyiceberg.io.pyarrow import ArrowScan, _dataframe_to_data_files
from pyiceberg.manifest import (
    DataFile,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
)
from pyiceberg.table import FileScanTask, Table, TableProperties, Transaction
from pyiceberg.table.snapshots import Operation
from pyiceberg.table.update.snapshot import _ManifestMergeManager, _OverwriteFiles

from sinks.iceberg.expressions import at_least, at_most, one_of
from sinks.iceberg.rebase import Carry, live

__all__ = [
    "IN_LIST_LIMIT",
    "MERGE_MANIFESTS_AT",
    "Rewrite",
    "plan_rewrite",
    "remove_files",
    "stage_snapshot",
]

# Up to this many distinct keys the files are pruned by the keys themselves
# (an IN list on the first key column); above it by their range, so that the
# manifests' evaluation does not grow with the epoch's size.
IN_LIST_LIMIT = 10_000
# An epoch's snapshot merges the table's small data manifests once there are this many.
MERGE_MANIFESTS_AT = 16


@dataclass
class Rewrite:
    """What one snapshot removes and adds.

    Attributes:
        removed: the data files that held an affected key.
        added: the new data files (the removed files' other rows, and the upserts).
        rows_removed: rows of the removed files that the epoch replaces or deletes.
    """

    removed: list[DataFile]
    added: list[DataFile]
    rows_removed: int
    # The filter the files that may hold an affected key pass: a rebase
    # checks the files appended since against it (rebase.rebase_onto).
    prune: BooleanExpression | None = None


def _prune_filter(affected: pa.Table, keys: Sequence[str]) -> BooleanExpression:
    """A filter every file holding an affected key passes (a superset: the rows decide)."""
    first = pc.unique(affected.column(keys[0]).combine_chunks())
    if len(first) <= IN_LIST_LIMIT:
        return one_of(keys[0], set(first.to_pylist()))
    bounds = pc.min_max(first)
    return And(at_least(keys[0], bounds["min"].as_py()), at_most(keys[0], bounds["max"].as_py()))


def plan_rewrite(
    table: Table, upserts: pa.Table, deletes: pa.Table, keys: Sequence[str]
) -> Rewrite:
    """The files to remove and add so the table holds ``upserts`` and none of ``deletes``' keys.

    Read on the snapshot ``table`` was loaded at; the new files are written
    (invisible until a snapshot names them).
    """
    target = table.schema().as_arrow()
    affected = pa.concat_tables([upserts.select(list(keys)), deletes.select(list(keys))]).cast(
        pa.schema([target.field(k) for k in keys])
    )
    removed: list[DataFile] = []
    kept: list[pa.Table] = []
    rows_removed = 0
    prune = _prune(affected, keys) if affected.num_rows else None
    tasks = _candidates(table, prune)
    if tasks:
        reader = ArrowScan(table.metadata, table.io, table.schema(), AlwaysTrue())
        for task in tasks:
            rows = reader.to_table([task]).cast(target)
            survivors = rows.join(affected, list(keys), join_type="left anti")
            if survivors.num_rows == rows.num_rows:
                continue  # the bounds matched, no key did: the file stays as it is
            removed.append(task.file)
            rows_removed += rows.num_rows - survivors.num_rows
            kept.append(survivors.select(target.names).cast(target))
    new = pa.concat_tables([*kept, upserts.cast(target)]) if kept else upserts.cast(target)
    added = list(_dataframe_to_data_files(table.metadata, new, table.io)) if new.num_rows else []
    return Rewrite(removed, added, rows_removed, prune)


def _prune(affected: pa.Table, keys: Sequence[str]) -> BooleanExpression:
    """The files' filter: by the keys, or every file for a key type pyiceberg cannot bind."""
    try:
        return _prune_filter(affected, keys)
    except (TypeError, ValueError):
        return AlwaysTrue()


def _candidates(table: Table, prune: BooleanExpression | None) -> list[FileScanTask]:
    """The data files of ``table``'s snapshot that ``prune`` matches (none without keys)."""
    if prune is None or table.metadata.current_snapshot_id is None:
        return []
    try:
        return list(table.scan(row_filter=prune).plan_files())
    except (TypeError, ValueError):
        # A key type whose literals pyiceberg cannot bind: read every file.
        return list(table.scan(row_filter=AlwaysTrue()).plan_files())


class _MergingOverwrite(_OverwriteFiles):
    """An overwrite snapshot whose data manifests are merged, as a merge-append merges them.

    Each epoch adds a manifest; unmerged, every later epoch's planning and
    commit would read one more file. pyiceberg merges manifests only for
    appends, so the overwrite does it here, with the table's own settings
    (``commit.manifest.target-size-bytes``, ``commit.manifest.min-count-to-merge``;
    the sink's default count is MERGE_MANIFESTS_AT, not pyiceberg's 100).
    """

    carry: Carry | None = None

    def _deleted_entries(self) -> list[ManifestEntry]:
        carry = self.carry
        if carry is not None and carry.reusable and carry.deleted is not None:
            # A rebase onto appends only: the same entries, deleted by this snapshot.
            return [
                ManifestEntry.from_args(
                    status=ManifestEntryStatus.DELETED,
                    snapshot_id=self._snapshot_id,
                    sequence_number=entry.sequence_number,
                    file_sequence_number=entry.file_sequence_number,
                    data_file=entry.data_file,
                )
                for entry in carry.deleted
            ]
        entries = super()._deleted_entries()
        if carry is not None:
            carry.deleted = entries
        return entries

    def _existing_manifests(self) -> list[ManifestFile]:
        carry = self.carry
        if carry is not None and carry.reusable and carry.existing is not None:
            # Nothing of the old base read again; a manifest of deleted
            # entries only is left out, as the appends since left it out.
            return [*(m for m in carry.existing if live(m)), *carry.appended]
        existing = super()._existing_manifests()
        if carry is not None:
            carry.existing = existing
        return existing

    def _process_manifests(self, manifests: list[ManifestFile]) -> list[ManifestFile]:
        if self.carry is not None and self.carry.reusable:
            # A rebase stays as cheap as what was appended meanwhile: merging
            # reads every manifest, so it waits for an uncontended epoch.
            return manifests
        properties = self._transaction.table_metadata.properties
        merger = _ManifestMergeManager(
            target_size_bytes=int(
                properties.get(
                    TableProperties.MANIFEST_TARGET_SIZE_BYTES,
                    TableProperties.MANIFEST_TARGET_SIZE_BYTES_DEFAULT,
                )
            ),
            min_count_to_merge=int(
                properties.get(TableProperties.MANIFEST_MIN_MERGE_COUNT, MERGE_MANIFESTS_AT)
            ),
            merge_enabled=True,
            snapshot_producer=self,
        )
        data = [m for m in manifests if m.content == ManifestContent.DATA]
        deletes = [m for m in manifests if m.content == ManifestContent.DELETES]
        return merger.merge_manifests(data) + deletes


def stage_snapshot(
    transaction: Transaction, rewrite: Rewrite, summary: dict[str, str], carry: Carry | None = None
) -> None:
    """Stage ONE overwrite snapshot that removes and adds the rewrite's files.

    With ``carry``, what the staging reads of its base is kept there, or,
    once ``rebase.rebase_onto`` found it still holds, reused instead.
    """
    base = transaction.table_metadata.current_snapshot()
    snapshot = _MergingOverwrite(
        operation=Operation.APPEND if base is None else Operation.OVERWRITE,
        transaction=transaction,
        io=transaction._table.io,
        snapshot_properties=summary,
    )
    if carry is not None:
        snapshot.carry = carry
        if carry.snapshot_id is None:
            carry.snapshot_id = snapshot._snapshot_id
        else:
            # The manifests written by the first staging carry its id.
            snapshot._snapshot_id = carry.snapshot_id
        if not carry.reusable:
            carry.base = None if base is None else base.snapshot_id
            manifests = [] if base is None else base.manifests(transaction._table.io)
            carry.base_manifests = frozenset(m.manifest_path for m in manifests if live(m))
    with snapshot:
        for data_file in rewrite.removed:
            snapshot.delete_data_file(data_file)
        for data_file in rewrite.added:
            snapshot.append_data_file(data_file)


def remove_files(table: Table, paths: Sequence[str]) -> None:
    """Delete data files that no snapshot names (a commit that was refused); best effort."""
    for path in paths:
        with contextlib.suppress(OSError):
            table.io.delete(path)
