"""A table's Delta log: app transaction versions per snapshot, and pruning below a checkpoint.

deltalake replays the log for every ``transaction_version`` call (about a
millisecond on a short log, more on a long one) and only prunes by age.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import NamedTuple

import pyarrow.fs as pafs  # type: ignore[import-untyped, unused-ignore]
from deltalake import DeltaTable

from expected_state.delta_files import filesystem

__all__ = [
    "EPOCHS_LOG_MARGIN",
    "PrunedLog",
    "last_checkpoint",
    "prune_log",
    "remember_written",
    "transaction_version",
]

# How many versions of the shared epochs table are kept below its newest one when
# its log is pruned: a writer whose snapshot is behind by fewer commits than this
# can still have its commit checked against the commits since.
EPOCHS_LOG_MARGIN = 100

# The attribute of a DeltaTable object that holds, by table version, the app
# transaction versions read on its snapshot or written by a commit based on it.
_MEMO = "_reconcile_transaction_versions"

_LOG_FILE = re.compile(r"^(\d{20})\.(json|crc|checkpoint\.parquet|checkpoint\.\d+\.\d+\.parquet)$")


def transaction_version(table: DeltaTable, app_id: str) -> int | None:
    """The version ``table``'s snapshot records for ``app_id`` (or None), read once per snapshot.

    A snapshot is immutable, so the answer is kept with the table object, under
    the snapshot's version, and read again only once the object has moved to
    another version (``update_incremental``, a load). The store reads its token
    and fence generations several times per epoch, on the same snapshot. Kept on
    the object (DeltaTable is not hashable, so no weak map can key on it): the
    memo dies with the snapshot it describes.
    """
    version = table.version()
    memo = _memo(table)
    known = memo.setdefault(version, {})
    for older in [v for v in memo if v < version]:
        del memo[older]
    if app_id not in known:
        known[app_id] = table.transaction_version(app_id)
    return known[app_id]


def remember_written(table: DeltaTable, version: int, written: Mapping[str, int]) -> None:
    """What a commit based on ``table``'s snapshot recorded, at the ``version`` it made.

    Only for a commit that is the version right after the snapshot (nothing
    else is in it). delta-rs leaves the object at its snapshot after a commit;
    once it is brought up to ``version``, :func:`transaction_version` answers
    these app ids from here instead of replaying the log.
    """
    _memo(table).setdefault(version, {}).update(written)


def _memo(table: DeltaTable) -> dict[int, dict[str, int | None]]:
    memo: dict[int, dict[str, int | None]] | None = getattr(table, _MEMO, None)
    if memo is None:
        memo = {}
        setattr(table, _MEMO, memo)
    return memo


class PrunedLog(NamedTuple):
    """What :func:`prune_log` did."""

    deleted: int  # log files deleted
    start: int | None  # the oldest version whose commit the log still holds (None: none)


def prune_log(
    table_uri: str, keep_from_version: int, *, check: Callable[[], None] | None = None
) -> PrunedLog:
    """Delete the log entries older than the newest checkpoint at or before ``keep_from_version``.

    Every version from that checkpoint on stays loadable (a reader starts from
    the newest checkpoint at or below the version it wants); older versions
    can no longer be time-travelled to. Without such a checkpoint nothing is
    deleted. ``_last_checkpoint`` is never touched. ``check`` (if given) is
    called before each deletion, and stops them by raising.

    Returns:
        How many log files were deleted, and the oldest version the log still
        holds a commit of (what a reader opened now can list, time travel to).
    """
    fs, root = filesystem(table_uri)
    log_dir = f"{root}/_delta_log"
    infos = fs.get_file_info(pafs.FileSelector(log_dir, allow_not_found=True))
    entries = []
    for info in infos:
        match = _LOG_FILE.match(info.base_name)
        if match:
            entries.append((int(match.group(1)), match.group(2), info.path))
    checkpoints = [
        v for v, kind, _ in entries if kind.startswith("checkpoint") and v <= keep_from_version
    ]
    floor = max(checkpoints, default=-1)
    doomed = [path for v, _, path in entries if v < floor]
    for path in doomed:
        if check is not None:
            check()
        fs.delete_file(path)
    start = min((v for v, kind, _ in entries if kind == "json" and v >= floor), default=None)
    return PrunedLog(len(doomed), start)


def last_checkpoint(table_uri: str) -> int | None:
    """The version of the table's newest checkpoint (``_last_checkpoint``), or None."""
    fs, root = filesystem(table_uri)
    try:
        with fs.open_input_stream(f"{root}/_delta_log/_last_checkpoint") as stream:
            return int(json.loads(stream.read())["version"])
    except (FileNotFoundError, OSError, ValueError, KeyError):
        return None
