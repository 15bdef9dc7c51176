"""What a store table holds on disk, split by why each file is still there (read-only).

A store table's folder holds, besides its Delta log:

- the files its newest version references: the base and merged change files
  (``live``), and the change files of single epochs not merged yet (``change``);
- files that only an older version still in the log references (``history``):
  time travel reads them, and ``vacuum()`` keeps those of the epochs recovery
  reads and prunes the log down to them;
- files that no version in the log references (``retained``): rewritten by a
  merge or a compaction before the oldest version the log still holds, or
  never committed (an epoch's file written ahead, a crashed writer's). Only
  vacuum's safety margin (minutes) and ``retention_hours`` (0 by default) keep
  them: the next vacuum deletes the ones older than both.

Everything is read from the Delta log and the file listing, through the same
filesystem the store writes with (a local folder or an object store such as
S3): nothing is written, no table is opened for writing. The figures are a
picture of one moment: a commit that lands while they are read shows its new
file as ``retained`` until the next reading.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, fields
from urllib.parse import unquote

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
import pyarrow.fs as pafs  # type: ignore[import-untyped, unused-ignore]
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from expected_state.delta_files import filesystem
from expected_state.holds import HOLDS_DIR
from expected_state.layout import classify

__all__ = ["DiskUse", "pipeline_disk_use", "table_disk_use"]

_LOG_DIR = "_delta_log"
_COMMIT = re.compile(r"^(\d{20})\.json$")


@dataclass(frozen=True, slots=True)
class DiskUse:
    """Bytes on disk of a store table (or a sum of tables), by why they are kept.

    Attributes:
        live: the base and merged change files of the newest version.
        change: the newest version's change files of single epochs (not merged yet).
        history: files only older versions still in the log reference.
        retained: files no version in the log references (kept until retention passes).
        log: the Delta log (commits, checkpoints), and the readers' holds (``_holds/``).
        files: how many data files (all but the log's).
    """

    live: int = 0
    change: int = 0
    history: int = 0
    retained: int = 0
    log: int = 0
    files: int = 0

    @property
    def total(self) -> int:
        """Every byte of the table's folder."""
        return self.live + self.change + self.history + self.retained + self.log

    def __add__(self, other: DiskUse) -> DiskUse:
        return DiskUse(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))

    def as_dict(self) -> dict[str, int]:
        """The figures in bytes, with ``total``."""
        return {**{f.name: getattr(self, f.name) for f in fields(self)}, "total": self.total}


def table_disk_use(table_uri: str, *, store_layout: bool = True) -> DiskUse | None:
    """The disk use of the Delta table at ``table_uri`` (None: no table there).

    Args:
        table_uri: the table's root (a local path or a URI the store reads).
        store_layout: the table is a store table, whose file names say whether a
            live file is a change file of one epoch (``change``) or not
            (``live``). False (the shared epochs table): every live file is ``live``.
    """
    try:
        table = DeltaTable(table_uri)
    except TableNotFoundError:
        return None
    newest = table.version()
    current = _add_paths(table)
    fs, root = filesystem(table_uri)
    log_infos = fs.get_file_info(pafs.FileSelector(f"{root}/{_LOG_DIR}", allow_not_found=True))
    commits = sorted(
        (int(m.group(1)), info.path)
        for info in log_infos
        if (m := _COMMIT.match(info.base_name)) and int(m.group(1)) <= newest
    )
    # The versions still in the log go from its oldest commit (the checkpoint
    # prune_log keeps, or version 0) to the newest: a file any of them
    # references is the oldest one's, or one a later commit added.
    referenced = set(current)
    if commits and commits[0][0] < newest:
        oldest = commits[0][0]
        referenced |= _add_paths(DeltaTable(table_uri, version=oldest))
        for version, path in commits:
            if version > oldest:
                referenced |= _commit_adds(fs, path)
    split = dict.fromkeys(("live", "change", "history", "retained", "log", "files"), 0)
    prefix = f"{root}/"
    for info in fs.get_file_info(pafs.FileSelector(root, recursive=True)):
        if info.type != pafs.FileType.File:
            continue
        relative = info.path.removeprefix(prefix)
        size = int(info.size or 0)
        if relative == _LOG_DIR or relative.startswith((f"{_LOG_DIR}/", f"{HOLDS_DIR}/")):
            split["log"] += size
            continue
        split["files"] += 1
        if relative in current:
            split[_kind(table_uri, relative, size) if store_layout else "live"] += size
        elif relative in referenced:
            split["history"] += size
        else:
            split["retained"] += size
    return DiskUse(**split)


def pipeline_disk_use(root: str, pipeline: str) -> dict[str, DiskUse]:
    """Sink name -> the disk use of each of ``pipeline``'s store tables under ``root``."""
    fs, base = filesystem(root)
    found = fs.get_file_info(pafs.FileSelector(f"{base}/{pipeline}", allow_not_found=True))
    uses: dict[str, DiskUse] = {}
    for info in sorted(found, key=lambda i: str(i.base_name)):
        if info.type != pafs.FileType.Directory:
            continue
        use = table_disk_use(f"{root.rstrip('/')}/{pipeline}/{info.base_name}")
        if use is not None:
            uses[info.base_name] = use
    return uses


def _add_paths(table: DeltaTable) -> set[str]:
    actions = pa.table(table.get_add_actions(flatten=False)).select(["path"])
    return {unquote(p) for p in actions.column("path").to_pylist()}


def _commit_adds(fs: pafs.FileSystem, path: str) -> set[str]:
    """The paths a JSON commit adds (a Delta path is URI-encoded)."""
    with fs.open_input_stream(path) as stream:
        lines = stream.read().decode().splitlines()
    adds = set()
    for line in lines:
        if line.strip():
            action = json.loads(line)
            if "add" in action:
                adds.add(unquote(action["add"]["path"]))
    return adds


def _kind(table_uri: str, relative: str, size: int) -> str:
    """``change`` for a change file of one epoch, else ``live`` (a base, a merged file)."""
    stored = classify(relative, relative, size, table=table_uri)
    return "change" if stored.kind == "change" and not stored.merged else "live"
