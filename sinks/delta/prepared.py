"""The prepared area of a Delta sink's table: manifests and staged Parquet files on disk.

Both Delta sinks (delta-rs, ``sinks.delta.sink``, and delta-spark,
``sinks.delta_spark.sink``) prepare the same way: the epoch's rows go in one
fsynced Parquet file under ``_txn_files/<key>/``, then, atomically, the
manifest ``_prepared/<key>.json`` that lists it; the manifest's presence is
what "prepared" means. This module is that one body: where the files live,
writing and reading (checked, ``sinks.delta.manifest``) the manifests,
dropping a txn's files, and listing what is prepared.
"""

from __future__ import annotations

import contextlib
import re
from pathlib import Path
from typing import Any

from expected_state.delta_commit import DataFile
from reconcile.core.contract import SinkTxnId, TxnIdParseError
from reconcile.core.durable import write_atomically
from sinks.delta.manifest import (
    FILES_DIR,
    PREPARED_DIR,
    check_own_folder,
    key_name,
    manifest_as_dict,
    manifest_body,
    read_manifest,
)

__all__ = ["PreparedArea"]

_FILE_GENERATION = re.compile(r"part-g(\d+)-")


class PreparedArea:
    """The manifests and staged files of one Delta sink table at ``directory``."""

    def __init__(self, directory: Path) -> None:
        """Serve the table whose root folder is ``directory``."""
        self.directory = directory

    def manifest_path(self, txn_id: SinkTxnId) -> Path:
        """Where ``txn_id``'s epoch's manifest lives (one per epoch, whatever the generation)."""
        return self.directory / PREPARED_DIR / f"{key_name(txn_id)}.json"

    def folder(self, txn_id: SinkTxnId) -> Path:
        """The folder of ``txn_id``'s epoch's staged Parquet files."""
        return self.directory / FILES_DIR / key_name(txn_id)

    def read(self, txn_id: SinkTxnId) -> dict[str, Any] | None:
        """The checked manifest of ``txn_id``'s epoch as a dict (txn, files, log_id).

        Raises:
            BadManifestError: a path that is not one of the sink's own files, or garbage.
        """
        manifest = read_manifest(self.directory, key_name(txn_id))
        return None if manifest is None else manifest_as_dict(manifest)

    def write(self, txn_id: SinkTxnId, files: list[DataFile], log_id: str | None) -> None:
        """Write the manifest atomically: temp file, fsync, rename, fsync the directory."""
        final = self.manifest_path(txn_id)
        final.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(final, manifest_body(txn_id, files, log_id))

    def remove(self, txn_id: SinkTxnId) -> None:
        """Delete the manifest of ``txn_id``'s epoch (none: nothing to do)."""
        with contextlib.suppress(FileNotFoundError):
            self.manifest_path(txn_id).unlink()

    def drop_files(self, txn_id: SinkTxnId, *, keep: frozenset[str] = frozenset()) -> None:
        """Delete the staged files of ``txn_id``'s epoch up to its generation, then the folder.

        Files are named ``part-g<generation>-...``: a newer writer's files are
        left alone (it may be between its file writes and its manifest).
        ``keep`` names relative paths to leave (a re-prepare's new files).

        Raises:
            BadManifestError: the folder is a symlink or resolves outside the table.
        """
        folder = self.folder(txn_id)
        check_own_folder(self.directory, folder)
        for path in folder.glob("part-g*.parquet") if folder.exists() else []:
            match = _FILE_GENERATION.match(path.name)
            rel = str(path.relative_to(self.directory))
            if rel in keep:
                continue
            if match is None or int(match[1]) <= txn_id.generation:
                path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            folder.rmdir()  # only once empty

    def listed(self) -> dict[str, SinkTxnId]:
        """Every txn with a manifest, and every epoch folder without one (generation 0).

        Manifests are renamed into place whole: one that fails its checks was
        changed by someone else, and raises BadManifestError, never skipped.
        """
        found: dict[str, SinkTxnId] = {}
        prepared_dir = self.directory / PREPARED_DIR
        for path in sorted(prepared_dir.glob("*.json")) if prepared_dir.exists() else []:
            manifest = read_manifest(self.directory, path.stem)
            if manifest is not None:
                found[key_name(manifest.txn)] = manifest.txn
        files_dir = self.directory / FILES_DIR
        for path in sorted(files_dir.iterdir()) if files_dir.exists() else []:
            if path.name not in found:
                with contextlib.suppress(TxnIdParseError):
                    found[path.name] = SinkTxnId.from_string(f"{path.name}-g0")
        return found

    def newer_holder(self, txn_id: SinkTxnId) -> bool:
        """Whether a newer generation than ``txn_id``'s holds the epoch's manifest."""
        manifest = self.read(txn_id)
        if manifest is None:
            return False
        return SinkTxnId.from_string(manifest["txn"]).generation > txn_id.generation
