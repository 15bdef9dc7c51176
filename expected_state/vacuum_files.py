"""Which unreferenced files of a Delta table ``vacuum()`` deletes, and deleting them.

delta-rs lists the candidates (``full=True``: files no kept version references,
whether a commit removed them or none ever added them); the age rule is applied
here, because delta-rs counts a retention in whole hours only. A candidate is
deleted once both:

- it was last written at least ``margin_minutes`` ago (the safety margin: an
  ``apply()``, or a Spark executor, writes its change file before the commit
  that references it, and that file must outlive the gap);
- it is older than ``retention_hours`` (0: no extra retention), counted from
  the commit that removed it where the log still says, as delta-rs counts it
  (in whole hours), and from its last write in any case (in any fraction).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import pyarrow.fs as pafs  # type: ignore[import-untyped, unused-ignore]
from deltalake import DeltaTable

from expected_state.delta_files import filesystem
from reconcile.core import hooks

__all__ = ["VACUUM_DELETING", "delete_unreferenced"]

# Between two deletions of a vacuum: a kill here leaves some candidates deleted
# and some not, none of them needed by a kept version.
VACUUM_DELETING = hooks.declare("expected_state.vacuum.deleting")


def delete_unreferenced(
    table: DeltaTable,
    *,
    keep_versions: list[int] | None,
    retention_hours: float,
    margin_minutes: float,
    now: float | None = None,
    check: Callable[[], None] | None = None,
) -> list[str]:
    """Delete the files of ``table`` no kept version references, old enough; return them.

    Args:
        table: the table (its current version is kept in any case).
        keep_versions: versions whose files stay, whatever their age (None: only
            the current one).
        retention_hours: the user's extra retention (>= 0, any fraction).
        margin_minutes: the safety margin (>= 0, any fraction).
        now: the time the ages are counted to (default: now).
        check: called before each deletion; raises to stop them (a vacuum whose
            "running" record lapsed: readers no longer wait for it).

    Returns:
        The paths deleted, relative to the table's root.
    """
    candidates: list[str] = list(
        table.vacuum(
            retention_hours=0,
            dry_run=True,
            enforce_retention_duration=False,
            keep_versions=keep_versions,
            full=True,
        )
    )
    if not candidates:
        return []
    if retention_hours >= 1:
        # WHY: a file a commit removed may have been written long before; a
        # time-travel reader of the version before that commit needs it for the
        # retention counted from the removal, which only the log knows (delta-rs
        # reads it, in whole hours: the floor, the write time below adds the rest).
        removed_long_ago = set(
            table.vacuum(
                retention_hours=math.floor(retention_hours),
                dry_run=True,
                enforce_retention_duration=False,
                keep_versions=keep_versions,
                full=True,
            )
        )
        candidates = [c for c in candidates if c in removed_long_ago]
    fs, root = filesystem(table.table_uri)
    paths = [f"{root.rstrip('/')}/{c}" for c in candidates]
    # WHY: never younger than the margin (a file written ahead of its commit
    # is unreferenced until that commit lands) nor than the user's retention.
    min_age_s = max(margin_minutes * 60.0, retention_hours * 3600.0)
    cutoff = (time.time() if now is None else now) - min_age_s
    deleted: list[str] = []
    for rel, path, info in zip(candidates, paths, fs.get_file_info(paths), strict=True):
        if info.type != pafs.FileType.File or info.mtime is None:
            continue  # gone meanwhile (another vacuum), or no time to judge it by: kept
        if info.mtime.timestamp() > cutoff:
            continue
        hooks.point(VACUUM_DELETING)
        if check is not None:
            check()
        try:
            fs.delete_file(path)
        except FileNotFoundError:
            continue  # another vacuum deleted it first
        deleted.append(rel)
    return deleted
