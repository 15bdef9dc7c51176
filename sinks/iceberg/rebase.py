"""What one staging of an epoch's snapshot read, kept so that the next base need not read it again.

Staging an overwrite reads every manifest of its base: to find the entries of
the files it removes, and to rewrite the manifests that hold them. Against a
co-writer that appends every few tens of milliseconds, a rebase that reads
them all again never lands: each attempt outlasts the gap between two of the
co-writer's commits, and each lost race adds a manifest to read next time.

So the first staging keeps what it read (a :class:`Carry`), and a rebase
reuses it when that is exact (:func:`rebase_onto`): every snapshot between the
old base and the new one is an append (no file was removed or rewritten, so
the files the epoch removes are still live, in the manifests read), the old
base's manifests of live files are all still there (an append drops one
that lists deleted files only), and no file appended since may hold
one of the epoch's keys (the manifests' column bounds, as a scan prunes by
them). The new snapshot is then the old one's manifests plus the appended
ones: the cost of a rebase follows what was appended meanwhile. Anything
else (a delete, a rewrite, a merge of manifests, a file that may hold a key)
plans and stages again from the new base.

Every attempt stages under one snapshot id (the first's): the manifests the
first staging wrote carry it, and a snapshot may list only its own new
manifests (their sequence numbers are assigned by its commit).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pyiceberg.expressions import BooleanExpression
from pyiceberg.expressions.visitors import _InclusiveMetricsEvaluator
from pyiceberg.manifest import ManifestContent, ManifestEntry, ManifestFile
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Operation

__all__ = ["Carry", "live", "rebase_onto"]


def live(manifest: ManifestFile) -> bool:
    """Whether ``manifest`` lists a live file (an append drops one that lists only deleted ones)."""
    return manifest.has_added_files() or manifest.has_existing_files()


@dataclass
class Carry:
    """What the first staging read of its base's manifests, for the next bases to reuse.

    Attributes:
        snapshot_id: the id every attempt stages under (None until the first staging).
        base: the snapshot the manifests were read on (None: an empty table).
        base_manifests: the paths of that snapshot's manifests of live files.
        existing: the manifests kept from it (those that held a removed file rewritten).
        deleted: its live entries of the files the epoch removes.
        appended: the manifests appended since ``base`` (set by rebase_onto).
        reusable: the next staging reuses all this (set by rebase_onto).
    """

    snapshot_id: int | None = None
    base: int | None = None
    base_manifests: frozenset[str] = frozenset()
    existing: list[ManifestFile] | None = None
    deleted: list[ManifestEntry] | None = None
    appended: list[ManifestFile] = field(default_factory=list)
    reusable: bool = False


def rebase_onto(carry: Carry, table: Table, prune: BooleanExpression | None) -> bool:
    """Whether ``carry`` (and the plan it was staged for) holds on ``table``'s snapshot too.

    Sets ``carry.reusable`` to the answer, and ``carry.appended`` to the
    manifests appended since its base when it holds.

    Args:
        carry: what the first staging read (nothing read yet: False).
        table: the new base.
        prune: the filter of the files that may hold an epoch's key (None: no key).
    """
    carry.reusable, carry.appended = False, []
    if carry.existing is None or carry.deleted is None:
        return False
    metadata = table.metadata
    snapshot = metadata.current_snapshot()
    current = snapshot
    while current is not None and current.snapshot_id != carry.base:
        operation = None if current.summary is None else current.summary.operation
        if operation != Operation.APPEND:
            return False  # a file may have been removed or rewritten since
        parent = current.parent_snapshot_id
        current = None if parent is None else metadata.snapshot_by_id(parent)
    if (None if current is None else current.snapshot_id) != carry.base:
        return False  # the old base is not an ancestor: main was rolled back or replaced
    manifests = [] if snapshot is None else snapshot.manifests(table.io)
    paths = {m.manifest_path for m in manifests}
    if not carry.base_manifests <= paths:
        return False  # manifests of live files were merged since: the kept ones are not the table's
    appended = [m for m in manifests if m.manifest_path not in carry.base_manifests and live(m)]
    if prune is not None and appended:
        try:
            may_hold = _InclusiveMetricsEvaluator(
                table.schema(), prune, include_empty_files=True
            ).eval
        except (TypeError, ValueError):
            return False  # a key type pyiceberg cannot bind: plan again
        for manifest in appended:
            if manifest.content != ManifestContent.DATA:
                return False
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
                if may_hold(entry.data_file):
                    return False  # a file appended since may hold one of the keys
    carry.appended, carry.reusable = appended, True
    return True
