"""A table's Delta log: pruning entries below a checkpoint (deltalake only prunes by age)."""

from __future__ import annotations

import json
import re

import pyarrow.fs as pafs  # type: ignore[import-untyped, unused-ignore]

from expected_state.delta_files import filesystem

__all__ = ["EPOCHS_LOG_MARGIN", "last_checkpoint", "prune_log"]

# How many versions of the shared epochs table are kept below its newest one when
# its log is pruned: a writer whose snapshot is behind by fewer commits than this
# can still have its commit checked against the commits since.
EPOCHS_LOG_MARGIN = 100

_LOG_FILE = re.compile(r"^(\d{20})\.(json|crc|checkpoint\.parquet|checkpoint\.\d+\.\d+\.parquet)$")


def prune_log(table_uri: str, keep_from_version: int) -> int:
    """Delete the log entries older than the newest checkpoint at or before ``keep_from_version``.

    Every version from that checkpoint on stays loadable (a reader starts from
    the newest checkpoint at or below the version it wants); older versions
    can no longer be time-travelled to. Without such a checkpoint nothing is
    deleted. ``_last_checkpoint`` is never touched.

    Returns:
        How many log files were deleted.
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
    if not checkpoints:
        return 0
    floor = max(checkpoints)
    doomed = [path for v, _, path in entries if v < floor]
    for path in doomed:
        fs.delete_file(path)
    return len(doomed)


def last_checkpoint(table_uri: str) -> int | None:
    """The version of the table's newest checkpoint (``_last_checkpoint``), or None."""
    fs, root = filesystem(table_uri)
    try:
        with fs.open_input_stream(f"{root}/_delta_log/_last_checkpoint") as stream:
            return int(json.loads(stream.read())["version"])
    except (FileNotFoundError, OSError, ValueError, KeyError):
        return None
