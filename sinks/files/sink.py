"""Filesystem two-phase-commit sink: prepare fsyncs a batch file, commit renames it atomically."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

from reconcile.core import hooks
from reconcile.core.claims import Claim
from reconcile.core.contract import (
    OK,
    Fatal,
    FatalError,
    FencedError,
    Retryable,
    SinkOutcome,
    SinkTxnId,
    TxnIdParseError,
)
from reconcile.core.durable import fsync_path, write_atomically
from reconcile.core.sink import SinkCapabilities
from sinks.base import local_path
from sinks.files.layout import (
    BatchStaging,
    make_dirs,
    read_batch,
    read_fences,
    read_header,
    remove_and_sync,
)
from sinks.ownership import describe_log, foreign_commit, foreign_prepare

__all__ = ["FENCE_WRITE", "FileSink", "open_uri", "read_batch", "read_header"]

# The fence update: a crash here (or anywhere in it) must leave the old fence
# or the new one, never a lower one. The update is one atomic replace.
FENCE_WRITE = hooks.declare("file_sink.fence.write")

_SUFFIX = ".batch"


class FileSink(BatchStaging):
    """A TwoPhaseSink that writes one JSON-lines batch file per epoch.

    Layout under ``root/<sink name>/``:

    - ``prepared/<txn>.batch``: durable, invisible (prepare wrote and fsynced it);
    - ``committed/<txn>.batch``: visible; the rename from ``prepared/`` is the
      atomic commit;
    - ``fence``: the newest writer generation per pipeline (JSON), replaced
      atomically; a stale writer is rejected.

    A batch file's first line is a header (txn id, epoch, row count, and the
    progress log id of the writer that prepared it); each further line is one
    row as JSON. Readers use only ``committed/``. Files are created 0600 (the
    umask may narrow that further) without following symlinks; directories
    are created with the process umask, and every new file or directory is
    made durable by fsyncing its parent.

    ``bind(writer)`` records the writer's log id in each batch header; an
    epoch found committed by another log (or by an unbound sink) is a Fatal
    MarkerMismatchError, never OK. Unbound, the sink is its own writer and
    writes ``"log_id": null``.
    """

    capabilities = SinkCapabilities(durable_prepare=True)

    def __init__(self, name: str, root: str | os.PathLike[str]) -> None:
        BatchStaging.__init__(self, name, "file sink {name}")
        self.directory = Path(root) / name
        self.prepared_dir = self.directory / "prepared"
        self.committed_dir = self.directory / "committed"
        for d in (self.prepared_dir, self.committed_dir):
            make_dirs(d)
        self._fence_path = self.directory / "fence"

    def prepare(self, txn_id: SinkTxnId) -> SinkOutcome:
        with self._fence(txn_id) as fenced:
            if fenced is not None:
                return fenced
            done = self._already_committed(txn_id, "prepare")
            if done is not None:
                return done  # OK: this log's epoch is already in the sink
            rows = self._staged.get(txn_id)
            if rows is None:
                # Staged rows died with the process that staged them.
                return Retryable(f"{txn_id}: nothing staged in this process")
            header = {
                "txn": str(txn_id),
                "epoch": txn_id.epoch,
                "rows": len(rows),
                "log_id": self._binding.log_id,
            }
            body = b"".join([json.dumps(header).encode() + b"\n", *(r + b"\n" for r in rows)])
            final = self._prepared_path(txn_id)
            # A temp file left by a prepare that died, or anything planted at its
            # name, goes first: unlink removes a symlink itself, never its target.
            final.with_name(final.name + ".tmp").unlink(missing_ok=True)
            # write_atomically: a temp file created 0600 with O_NOFOLLOW (a symlink
            # planted at its name is refused, never written through), fsynced,
            # renamed into place, the folder fsynced: the prepared batch appears
            # whole or not at all, and the rename is durable.
            write_atomically(final, body)
            del self._staged[txn_id]
            return OK

    def commit(self, txn_id: SinkTxnId) -> SinkOutcome:
        done = self._already_committed(txn_id, "commit")
        if done is not None:
            if done:
                # Idempotent, whoever asks: committed before (perhaps the ack was
                # lost). A prepared batch of this txn is a stale leftover: drop it.
                remove_and_sync(self._prepared_path(txn_id))
            return done
        with self._fence(txn_id) as fenced:
            if fenced is not None:
                return fenced
            source = self._prepared_path(txn_id)
            try:
                owner = read_header(source).get("log_id")
            except FileNotFoundError:
                return Fatal(f"{txn_id}: commit of a batch that was never prepared")
            except (OSError, ValueError) as exc:
                return Fatal.of(
                    FatalError(f"{txn_id}: prepared batch {source} is unreadable: {exc}")
                )
            if owner != self._binding.log_id:
                return foreign_prepare(
                    f"file sink {self._name!r}",
                    txn_id,
                    found_log=owner,
                    log_id=self._binding.log_id,
                    location=str(source),
                )
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
        for path in (prepared, prepared.with_name(prepared.name + ".tmp")):
            remove_and_sync(path)
        return OK

    def recover(self) -> Sequence[SinkTxnId]:
        stranded = []
        for path in sorted(self.prepared_dir.iterdir()):
            if path.suffix == ".tmp":
                # A prepare that died before its rename: never prepared.
                remove_and_sync(path)
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

    def _already_committed(self, txn_id: SinkTxnId, where: str) -> SinkOutcome | None:
        """None if the epoch is not committed; OK if this log committed it; else Fatal."""
        path = self._committed_file(txn_id)
        if path is None:
            return None
        try:
            header = read_header(path)
        except (OSError, ValueError) as exc:
            return Fatal.of(
                FatalError(
                    f"file sink {self._name!r}, {where} of {txn_id}: the committed batch "
                    f"{path} is unreadable ({exc}); it is not treated as committed"
                )
            )
        found = header.get("log_id")
        if found == self._binding.log_id:
            # This log's batch: believed only as far as the store decided.
            claim = Claim(self._name, f"file sink {self._name!r}", f"committed batch {path}",
                          "commit", txn_id.epoch, generation=_generation(path))  # fmt: skip
            untrusted = self._binding.untrusted(claim)
            return OK if untrusted is None else untrusted
        return foreign_commit(
            f"file sink {self._name!r}",
            txn_id,
            where,
            found_txn=str(header.get("txn")),
            found_log=found,
            log_id=self._binding.log_id,
            location=str(path),
            advice=(
                "to write this pipeline's epochs again, move that run's committed batches "
                f"({self.committed_dir}/{txn_id.pipeline}-{txn_id.sink}-*{_SUFFIX}) out of "
                "the sink first, or give this pipeline another sink root."
            ),
        )

    @contextlib.contextmanager
    def _fence(self, txn_id: SinkTxnId) -> Iterator[SinkOutcome | None]:
        """Hold the sink's lock; yield Fatal if ``txn_id`` is from a stale generation.

        The lock is a ``flock`` on the sink's folder: the fence file itself is
        replaced by rename, so a lock on it would not outlive an update.
        """
        fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                fences = read_fences(self._fence_path)
            except FatalError as exc:
                yield Fatal.of(exc)
                return
            newest = fences.generation(txn_id.pipeline)
            if txn_id.generation < newest.generation:
                yield Fatal.of(self._fenced_error(txn_id, newest.generation, newest.log_id))
                return
            if txn_id.generation > newest.generation:
                updated = fences.with_generation(
                    txn_id.pipeline, txn_id.generation, self._binding.log_id
                )
                hooks.point(FENCE_WRITE)
                # One atomic replace (temp file, fsync, rename, folder fsync): a
                # crash leaves the old fence or the new one, never a lower one.
                write_atomically(self._fence_path, updated.encode())
            yield None
        finally:
            os.close(fd)

    def _fenced_error(self, txn_id: SinkTxnId, newest: int, owner: str | None) -> FencedError:
        mine = self._binding.log_id
        detail = ""
        if owner != mine:
            # Generations of two progress logs are unrelated numbers: say so, or
            # a fresh state meeting an old run's fence would look like a zombie.
            detail = (
                f" (the fence was set by {describe_log(owner)}; this writer has "
                f"{describe_log(mine)}: another state writes under the same pipeline and "
                "sink names)"
            )
        return FencedError(
            f"{txn_id}: fenced, generation {newest} has taken over{detail}",
            generation=txn_id.generation,
            fence=newest,
        )


def open_uri(name: str, uri: str) -> FileSink:
    """The sink of ``file:///path``: its files under ``<path>/<name>``.

    Raises:
        ConfigurationError: the URI names a remote host.
    """
    return FileSink(name, local_path(name, uri))


def _generation(path: Path) -> int | None:
    """The writer generation a committed batch's name carries (None: not a txn id)."""
    try:
        return SinkTxnId.from_string(path.name.removesuffix(_SUFFIX)).generation
    except TxnIdParseError:
        return None
