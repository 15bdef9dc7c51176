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

import functools
import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

from deltalake import DeltaTable

from expected_state.delta_commit import DataFile
from reconcile.core.claims import Claim
from reconcile.core.contract import (
    Fatal,
    FatalError,
    MarkerMismatchError,
    SinkOutcome,
    SinkTxnId,
    TxnIdParseError,
)
from sinks.ownership import WriterBinding, foreign_commit

__all__ = [
    "FILES_DIR",
    "LOG_ID_KEY",
    "PREPARED_DIR",
    "BadManifestError",
    "Manifest",
    "check_own_folder",
    "commit_metadata",
    "commit_owner_outcome",
    "commit_record",
    "data_file_name",
    "key_name",
    "manifest_as_dict",
    "manifest_body",
    "read_manifest",
    "reconcile_fields",
    "refuse_bad_manifest",
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


_Sink = TypeVar("_Sink")


def refuse_bad_manifest(
    operation: Callable[[_Sink, SinkTxnId], SinkOutcome],
) -> Callable[[_Sink, SinkTxnId], SinkOutcome]:
    """Turn a manifest that fails its checks into a Fatal outcome naming it.

    A manifest whose paths are not the sink's own files (tampered, or written
    by another program) must never lead to a deletion or a Delta commit: the
    check raises before either, and the operator is told which entry it was.
    """

    @functools.wraps(operation)
    def checked(sink: _Sink, txn_id: SinkTxnId) -> SinkOutcome:
        try:
            return operation(sink, txn_id)
        except BadManifestError as exc:
            return Fatal.of(exc)

    return checked


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


def manifest_as_dict(manifest: Manifest) -> dict[str, Any]:
    """A checked manifest in the shape the sink reads (txn, files, log_id)."""
    return {
        "txn": str(manifest.txn),
        "files": [
            {k: v for k, v in asdict(f).items() if k != "partition_values"} for f in manifest.files
        ],
        "log_id": manifest.log_id,
    }


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
    for info in map(reconcile_fields, table.history()):
        if info.get("reconcile.app_id") == app_id and info.get("reconcile.version") == epoch:
            return info
    return None


def reconcile_fields(info: Mapping[str, Any]) -> dict[str, Any]:
    """A commitInfo with the ``reconcile.*`` fields, wherever the writer put them.

    delta-rs records them as commitInfo fields of their own; delta-spark can
    only set ``userMetadata`` (one string), so the delta-spark sink writes
    them there as a JSON object, which is read back here.
    """
    fields = dict(info)
    raw = info.get("userMetadata")
    if isinstance(raw, str) and raw.startswith("{"):
        try:
            body = json.loads(raw)
        except ValueError:
            return fields  # another program's userMetadata: not ours
        if isinstance(body, dict):
            fields.update({k: v for k, v in body.items() if k.startswith("reconcile.")})
    return fields


def commit_metadata(txn_id: SinkTxnId, log_id: str | None) -> dict[str, Any]:
    """The commitInfo fields of ``txn_id``'s commit: the txn and the writer's log id (if bound)."""
    metadata: dict[str, Any] = {"reconcile.txn": str(txn_id)}
    if log_id is not None:
        metadata[LOG_ID_KEY] = log_id
    return metadata


def commit_owner_outcome(
    table: DeltaTable,
    app_id: str,
    txn_id: SinkTxnId,
    where: str,
    *,
    sink: str,
    uri: str,
    binding: WriterBinding,
) -> SinkOutcome | None:
    """None if the commit of ``txn_id``'s (committed) epoch is this writer's, else Fatal.

    This writer's: made for its progress log, and claiming only what the
    store decided (``reconcile.core.claims``). The log id is read from that
    commit's metadata. If the commit is no longer in the Delta log (log
    retention), whose it was cannot be told, and that is an error too:
    answering OK on a guess is what would skip an epoch silently.

    Args:
        table: the table, whose token says the epoch is committed.
        app_id: the token's app id (``<pipeline>/<sink>``).
        txn_id: the txn being prepared or committed.
        where: "prepare" or "commit", for the message.
        sink: the sink's name; uri: its table, for the message.
        binding: the writer the sink serves (its log id, and the store's decisions).
    """
    log_id = binding.log_id
    record = commit_record(table, app_id, txn_id.epoch)
    if record is None:
        return Fatal.of(
            MarkerMismatchError(
                f"Delta sink {sink!r}, {where} of {txn_id}: the table {uri!r} records epoch "
                f"{txn_id.epoch} as committed, but the commit that recorded it is no longer "
                "in the Delta log (log retention removed it), so which progress log wrote it "
                "cannot be read. The epoch is NOT treated as committed and nothing was "
                f"written. Compare the table's rows with _epoch = {txn_id.epoch} to this "
                "pipeline's output before going on; a Delta table's commits cannot be taken "
                "back.",
                pipeline=txn_id.pipeline,
                sink=txn_id.sink,
                epoch=txn_id.epoch,
                log_id=log_id,
            )
        )
    found = record.get(LOG_ID_KEY)
    if found == log_id:
        # This log's commit: believed only as far as the store decided.
        try:
            txn = SinkTxnId.from_string(str(record.get("reconcile.txn")))
            generation: int | None = txn.generation
        except TxnIdParseError:
            generation = None
        claim = Claim(sink, f"Delta sink {sink!r}", f"Delta table {uri!r} (version "
                      f"{record.get('version')})", "commit", txn_id.epoch,
                      generation=generation)  # fmt: skip
        return binding.untrusted(claim)
    return foreign_commit(
        f"Delta sink {sink!r}",
        txn_id,
        where,
        found_txn=str(record.get("reconcile.txn")),
        found_log=found,
        log_id=log_id,
        location=f"Delta table {uri!r} (version {record.get('version')})",
        advice=(
            "to write this pipeline's epochs again, give it a new table (another sink root "
            "or sink name): a Delta table's commits cannot be taken back."
        ),
    )
