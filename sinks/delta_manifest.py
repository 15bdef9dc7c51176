"""The Delta sink's manifests and commit records: what prepare wrote, checked before it is used.

A manifest (``_prepared/<pipeline>-<sink>-<epoch>.json``) lists the Parquet
files a prepare wrote. Its entries are paths that the sink later deletes (a
re-prepare drops the previous manifest's files) and adds to the Delta log (a
commit), so an entry is accepted only if it is a file the sink itself could
have written: relative, exactly ``_txn_files/<key>/part-g<generation>-<32 hex>.parquet``
for the manifest's own txn, and inside the table root once symlinks are
resolved. Anything else (an absolute path, ``..``, a symlink out of the root,
another name) makes the manifest untrustworthy: the operation stops with a
Fatal naming the manifest and the entry, and nothing is deleted or committed.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deltalake import DeltaTable

from expected_state.delta_commit import DataFile
from reconcile.contract import FatalError, SinkTxnId, TxnIdParseError

__all__ = [
    "FILES_DIR",
    "LOG_ID_KEY",
    "PREPARED_DIR",
    "BadManifestError",
    "Manifest",
    "check_own_folder",
    "commit_record",
    "data_file_name",
    "key_name",
    "manifest_body",
    "read_manifest",
]

PREPARED_DIR = "_prepared"  # manifests: <pipeline>-<sink>-<epoch>.json
# Data files live under a directory whose name starts with '_': Delta readers
# read them through the log like any other file, and vacuum never deletes a
# prepared-but-uncommitted file there (it skips '_' paths), which keeps the
# promise of prepare: once it returned OK, commit can succeed after any delay.
FILES_DIR = "_txn_files"
# The commitInfo field that records the progress log id of the writer.
LOG_ID_KEY = "reconcile.log_id"

_DATA_FILE = re.compile(r"part-g(0|[1-9][0-9]{0,18})-[0-9a-f]{32}\.parquet")
_ENTRY_FIELDS = {"path", "size", "num_records", "stats", "modification_time"}


class BadManifestError(FatalError):
    """A manifest the sink did not write as it is: a path outside its own files, or garbage."""


def key_name(txn_id: SinkTxnId) -> str:
    """The generation-free name of a txn: idempotency keys on (pipeline, sink, epoch)."""
    return f"{txn_id.pipeline}-{txn_id.sink}-{txn_id.epoch}"


def data_file_name(txn_id: SinkTxnId, unique: str) -> str:
    """The relative path of a data file that ``txn_id``'s prepare writes."""
    return f"{FILES_DIR}/{key_name(txn_id)}/part-g{txn_id.generation}-{unique}.parquet"


@dataclass(frozen=True)
class Manifest:
    """A checked manifest: its txn, its data files, and the log id of the writer."""

    txn: SinkTxnId
    files: list[DataFile]
    log_id: str | None


def manifest_body(txn_id: SinkTxnId, files: list[DataFile], log_id: str | None) -> bytes:
    """The bytes of the manifest of ``txn_id`` listing ``files``."""
    entries = [
        {
            "path": f.path,
            "size": f.size,
            "num_records": f.num_records,
            "stats": f.stats,
            "modification_time": f.modification_time,
        }
        for f in files
    ]
    return json.dumps({"txn": str(txn_id), "files": entries, "log_id": log_id}).encode()


def _inside(root: Path, path: Path) -> bool:
    """Whether ``path``, symlinks resolved, is ``root`` (resolved) or below it."""
    return Path(os.path.realpath(path)).is_relative_to(os.path.realpath(root))


def check_own_folder(root: Path, folder: Path) -> None:
    """Raise BadManifestError unless ``folder`` is a real folder inside the table root.

    abort() deletes files by name in ``_txn_files/<key>/``: a symlink planted
    there must not turn that into deletions elsewhere.
    """
    if folder.is_symlink() or not _inside(root, folder):
        raise BadManifestError(
            f"Delta sink folder {folder} is a symlink or resolves outside the table root "
            f"{root}; nothing was deleted. Remove the link by hand.",
            path=str(folder),
        )


def _check_entry(root: Path, where: Path, txn: SinkTxnId, entry: Any) -> DataFile:
    if not isinstance(entry, dict) or set(entry) != _ENTRY_FIELDS:
        raise BadManifestError(
            f"manifest {where} has a file entry {entry!r:.200} that is not of the form the "
            "sink writes; nothing was deleted or committed",
            manifest=str(where),
        )
    rel = entry["path"]
    folder = f"{FILES_DIR}/{key_name(txn)}/"
    name = rel[len(folder) :] if isinstance(rel, str) and rel.startswith(folder) else None
    match = _DATA_FILE.fullmatch(name) if name is not None else None
    full = root / rel if isinstance(rel, str) else root
    if (
        match is None
        or int(match[1]) != txn.generation
        or full.is_symlink()
        or not _inside(root, full)
    ):
        raise BadManifestError(
            f"manifest {where} lists {rel!r:.300}, which is not a file this sink wrote for "
            f"{txn} (expected {folder}part-g{txn.generation}-<32 hex>.parquet, a regular "
            f"file inside the table root {root}); nothing was deleted or committed. The "
            "manifest was changed by hand or by another program: remove it (and the txn's "
            f"folder {root / FILES_DIR / key_name(txn)}) once you know what wrote it.",
            manifest=str(where),
            entry=str(rel)[:300],
        )
    if not all(isinstance(entry[k], int) for k in ("size", "num_records", "modification_time")):
        raise BadManifestError(f"manifest {where}: entry {rel!r} has non-integer sizes")
    if not isinstance(entry["stats"], str):
        raise BadManifestError(f"manifest {where}: entry {rel!r} has non-string stats")
    return DataFile(**entry, partition_values={})


def read_manifest(root: Path, key: str) -> Manifest | None:
    """Read and check the manifest ``<root>/_prepared/<key>.json``; None if there is none.

    Raises:
        BadManifestError: the manifest is not JSON, names another txn than its
            file name, or lists a path that is not one of the sink's own files.
    """
    where = root / PREPARED_DIR / f"{key}.json"
    try:
        raw = where.read_bytes()
    except FileNotFoundError:
        return None
    try:
        body = json.loads(raw)
        txn = SinkTxnId.from_string(body["txn"])
        entries = body["files"]
        log_id = body.get("log_id")
        if not isinstance(entries, list) or not (log_id is None or isinstance(log_id, str)):
            raise TypeError("files must be a list and log_id a string or null")
    except (ValueError, KeyError, TypeError, TxnIdParseError) as exc:
        raise BadManifestError(
            f"manifest {where} is unreadable ({exc}); nothing was deleted or committed. "
            "Manifests are written atomically, so this one was changed by another program.",
            manifest=str(where),
        ) from exc
    if key_name(txn) != key:
        raise BadManifestError(
            f"manifest {where} names txn {txn}, not one of epoch key {key!r}; nothing was "
            "deleted or committed",
            manifest=str(where),
        )
    return Manifest(txn, [_check_entry(root, where, txn, e) for e in entries], log_id)


def commit_record(table: DeltaTable, app_id: str, epoch: int) -> dict[str, Any] | None:
    """The commitInfo of the Delta commit that recorded ``(app_id, epoch)``, if still in the log.

    Read only where an epoch is found committed, to learn which progress log
    wrote it; that is off the per-epoch path.
    """
    for info in table.history():
        if info.get("reconcile.app_id") == app_id and info.get("reconcile.version") == epoch:
            return dict(info)
    return None
