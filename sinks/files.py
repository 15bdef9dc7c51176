"""Filesystem two-phase-commit sink: prepare fsyncs a batch file, commit renames it atomically."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from reconcile.contract import (
    OK,
    Fatal,
    Retryable,
    SinkOutcome,
    SinkTxnId,
    TxnIdParseError,
    validate_name,
)
from reconcile.durable import fsync_path

__all__ = ["FileSink", "read_batch"]

_SUFFIX = ".batch"


class FileSink:
    """A TwoPhaseSink that writes one JSON-lines batch file per epoch.

    Layout under ``root/<sink name>/``:

    - ``prepared/<txn>.batch``: durable, invisible (prepare wrote and fsynced it);
    - ``committed/<txn>.batch``: visible; the rename from ``prepared/`` is the
      atomic commit;
    - ``fence``: the newest writer generation; a stale writer is rejected.

    A batch file's first line is a header (txn id, epoch, row count); each
    further line is one row as JSON. Readers use only ``committed/``.
    """

    def __init__(self, name: str, root: str | os.PathLike[str]) -> None:
        self._name = validate_name("sink", name)
        self.directory = Path(root) / name
        self.prepared_dir = self.directory / "prepared"
        self.committed_dir = self.directory / "committed"
        for d in (self.prepared_dir, self.committed_dir):
            d.mkdir(parents=True, exist_ok=True)
        self._fence_path = self.directory / "fence"
        self._staged: dict[SinkTxnId, list[bytes]] = {}

    @property
    def name(self) -> str:
        return self._name

    def stage(self, txn_id: SinkTxnId, rows: Iterable[Any]) -> SinkOutcome:
        encoded: list[bytes] = []
        for i, row in enumerate(rows):
            try:
                encoded.append(json.dumps(row, sort_keys=True, allow_nan=False).encode())
            except (TypeError, ValueError) as exc:
                return Fatal(
                    f"sink {self._name!r}, {txn_id}: row {i} ({row!r}) cannot be written as "
                    f"JSON: {exc}. Nothing was staged."
                )
        self._staged[txn_id] = encoded
        return OK

    def prepare(self, txn_id: SinkTxnId) -> SinkOutcome:
        with self._fence(txn_id) as fenced:
            if fenced is not None:
                return fenced
            if self._committed_file(txn_id) is not None:
                return OK  # this epoch is already in the sink
            rows = self._staged.get(txn_id)
            if rows is None:
                # Staged rows died with the process that staged them.
                return Retryable(f"{txn_id}: nothing staged in this process")
            header = json.dumps({"txn": str(txn_id), "epoch": txn_id.epoch, "rows": len(rows)})
            final = self._prepared_path(txn_id)
            tmp = final.with_suffix(".tmp")
            with open(tmp, "wb") as f:
                f.write(header.encode() + b"\n")
                for line in rows:
                    f.write(line + b"\n")
                f.flush()
                os.fsync(f.fileno())
            # The rename makes the prepared batch appear whole or not at all;
            # the directory fsync makes the rename itself durable.
            os.replace(tmp, final)
            fsync_path(self.prepared_dir)
            del self._staged[txn_id]
            return OK

    def commit(self, txn_id: SinkTxnId) -> SinkOutcome:
        if self._committed_file(txn_id) is not None:
            # Idempotent, whoever asks: committed before (perhaps the ack was
            # lost). A prepared batch of this txn is a stale leftover: drop it.
            self._prepared_path(txn_id).unlink(missing_ok=True)
            return OK
        with self._fence(txn_id) as fenced:
            if fenced is not None:
                return fenced
            source = self._prepared_path(txn_id)
            if not source.exists():
                return Fatal(f"{txn_id}: commit of a batch that was never prepared")
            os.rename(source, self.committed_dir / source.name)
            fsync_path(self.committed_dir)
            fsync_path(self.prepared_dir)
            return OK

    def abort(self, txn_id: SinkTxnId) -> SinkOutcome:
        self._staged.pop(txn_id, None)
        if self._committed_file(txn_id) is not None:
            return Fatal(f"{txn_id}: abort of a committed batch; committed data stays")
        # The file names carry the generation, so this removes only this
        # writer's batch: a stale writer cannot discard a newer writer's.
        prepared = self._prepared_path(txn_id)
        for path in (prepared, prepared.with_suffix(".tmp")):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        fsync_path(self.prepared_dir)
        return OK

    def recover(self) -> Sequence[SinkTxnId]:
        stranded = []
        for path in sorted(self.prepared_dir.iterdir()):
            if path.suffix == ".tmp":
                # A prepare that died before its rename: never prepared.
                path.unlink(missing_ok=True)
                continue
            try:
                stranded.append(SinkTxnId.from_string(path.name.removesuffix(_SUFFIX)))
            except TxnIdParseError:
                continue  # not ours
        return stranded

    # ------------------------------------------------------------ internals

    def _prepared_path(self, txn_id: SinkTxnId) -> Path:
        return self.prepared_dir / f"{txn_id}{_SUFFIX}"

    def _committed_file(self, txn_id: SinkTxnId) -> Path | None:
        """The committed batch of this epoch, by whichever generation committed it."""
        pattern = f"{txn_id.pipeline}-{txn_id.sink}-{txn_id.epoch}-g*{_SUFFIX}"
        return next(iter(sorted(self.committed_dir.glob(pattern))), None)

    @contextlib.contextmanager
    def _fence(self, txn_id: SinkTxnId) -> Iterator[SinkOutcome | None]:
        """Hold the fence lock; yield Fatal if ``txn_id`` is from a stale generation."""
        fd = os.open(self._fence_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            raw = os.pread(fd, 32, 0).strip()
            newest = int(raw) if raw else 0
            if txn_id.generation < newest:
                yield Fatal(f"{txn_id}: fenced, generation {newest} has taken over")
                return
            if txn_id.generation > newest:
                os.ftruncate(fd, 0)
                os.pwrite(fd, str(txn_id.generation).encode(), 0)
                os.fsync(fd)
            yield None
        finally:
            os.close(fd)


def read_batch(path: str | os.PathLike[str]) -> tuple[SinkTxnId, list[Any]]:
    """Read one batch file: its txn id and its rows."""
    with open(path, "rb") as f:
        header = json.loads(f.readline())
        rows = [json.loads(line) for line in f]
    return SinkTxnId.from_string(header["txn"]), rows
