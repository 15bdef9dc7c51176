"""The file sink's files: durable folder creation, batch headers, and the fence file's format."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reconcile.core.contract import (
    OK,
    Change,
    Fatal,
    FatalError,
    SinkOutcome,
    SinkTxnId,
    WriterIdentity,
    validate_name,
)
from reconcile.core.durable import fsync_path
from sinks.ownership import WriterBinding

__all__ = [
    "DELETE",
    "MAX_HEADER",
    "OP",
    "BatchStaging",
    "Fence",
    "Fences",
    "encode_rows",
    "make_dirs",
    "parse_header",
    "read_batch",
    "read_fences",
    "read_header",
    "remove_and_sync",
]

# A batch line that is a delete of its key (see encode_rows).
OP, DELETE = "_op", "delete"
# A header is one short JSON line; a longer first line is not a batch header.
MAX_HEADER = 64 * 1024
# The generation below which every pipeline is fenced, read from a fence file
# in the older format (one plain integer, shared by every pipeline of the sink).
_FLOOR = "*"


def encode_rows(sink: str, txn_id: SinkTxnId, rows: Iterable[Any]) -> list[bytes] | Fatal:
    """Each row as one JSON line of a batch, or the Fatal naming the first row JSON cannot hold.

    A row is any JSON value; a ``Change`` is its row, and a delete is its key
    columns with ``"_op": "delete"`` (``OP``), which a pull of the sink folds
    as the key's removal. ``_op`` is reserved in a dict row for that reason.
    """
    encoded: list[bytes] = []
    for i, row in enumerate(rows):
        if isinstance(row, Change):
            row = {**row.row, OP: DELETE} if row.op == "delete" else row.row
        elif isinstance(row, dict) and OP in row:
            return Fatal(
                f"sink {sink!r}, {txn_id}: row {i} has a column {OP!r}, which the file "
                "sinks reserve to mark a delete (pass a Change('delete', key) instead). "
                "Nothing was staged."
            )
        try:
            encoded.append(json.dumps(row, sort_keys=True, allow_nan=False).encode())
        except (TypeError, ValueError) as exc:
            return Fatal(
                f"sink {sink!r}, {txn_id}: row {i} ({row!r}) cannot be written as "
                f"JSON: {exc}. Nothing was staged."
            )
    return encoded


class BatchStaging:
    """What the file sinks share, on a local disk or on S3: a name, a writer binding, staged rows.

    Staged rows are kept encoded (``encode_rows``) in this process until
    ``prepare`` writes them as one batch; a sink subclasses this for the
    rest of the contract.
    """

    def __init__(self, name: str, what: str) -> None:
        self._name = validate_name("sink", name)
        self._staged: dict[SinkTxnId, list[bytes]] = {}
        self._binding = WriterBinding(what.format(name=repr(self._name)))

    @property
    def name(self) -> str:
        return self._name

    def bind(self, writer: WriterIdentity) -> None:
        """Serve ``writer`` (idempotent); see :class:`sinks.ownership.WriterBinding`."""
        self._binding.bind(writer)

    def stage(self, txn_id: SinkTxnId, rows: Iterable[Any]) -> SinkOutcome:
        encoded = encode_rows(self._name, txn_id, rows)
        if isinstance(encoded, Fatal):
            return encoded
        self._staged[txn_id] = encoded
        return OK


def make_dirs(path: Path) -> None:
    """Create ``path`` and its missing parents, fsyncing each new folder's parent.

    A folder's entry lives in its parent: without the parent's fsync a power
    loss can take a new folder away, and every file prepared in it.
    """
    missing: list[Path] = []
    current = path
    while not current.is_dir():
        missing.append(current)
        if current.parent == current:
            break
        current = current.parent
    for folder in reversed(missing):
        try:
            folder.mkdir()
        except FileExistsError:
            if not folder.is_dir():
                raise
        fsync_path(folder.parent)


def remove_and_sync(path: Path) -> bool:
    """Remove ``path`` if it exists and make the removal durable; True if it existed."""
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    fsync_path(path.parent)
    return True


def read_header(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The header (first line) of a batch file, as a dict.

    Raises:
        OSError: the file cannot be read (FileNotFoundError if it is gone).
        ValueError: the first line is not a JSON object of bounded size.
    """
    with open(path, "rb") as f:
        line = f.readline(MAX_HEADER + 1)
    return parse_header(line, str(path))


def parse_header(line: bytes, where: str) -> dict[str, Any]:
    """A batch header from the first line of a batch (``where`` names the batch in errors).

    Raises:
        ValueError: the line is not a JSON object with a txn id, of bounded size.
    """
    line = line.split(b"\n", 1)[0]
    if len(line) > MAX_HEADER:
        raise ValueError(f"{where}: first line longer than {MAX_HEADER} bytes")
    header = json.loads(line)
    if not isinstance(header, dict) or "txn" not in header:
        raise ValueError(f"{where}: first line is not a batch header: {line[:200]!r}")
    return header


def read_batch(path: str | os.PathLike[str]) -> tuple[SinkTxnId, list[Any]]:
    """Read one batch file: its txn id and its rows."""
    with open(path, "rb") as f:
        header = json.loads(f.readline())
        rows = [json.loads(line) for line in f]
    return SinkTxnId.from_string(header["txn"]), rows


@dataclass(frozen=True)
class Fence:
    """A pipeline's newest writer generation in a sink, and the log that set it."""

    generation: int = 0
    log_id: str | None = None


@dataclass(frozen=True)
class Fences:
    """The fence file's content: one Fence per pipeline writing through the sink."""

    by_pipeline: Mapping[str, Fence] = field(default_factory=dict)

    def generation(self, pipeline: str) -> Fence:
        """The fence ``pipeline``'s writers must not go below."""
        own = self.by_pipeline.get(pipeline, Fence())
        floor = self.by_pipeline.get(_FLOOR, Fence())
        return own if own.generation >= floor.generation else floor

    def with_generation(self, pipeline: str, generation: int, log_id: str | None) -> Fences:
        """These fences with ``pipeline`` raised to ``generation`` by ``log_id``."""
        return Fences({**self.by_pipeline, pipeline: Fence(generation, log_id)})

    def encode(self) -> bytes:
        """The fence file's bytes."""
        body = {
            name: {"generation": fence.generation, "log_id": fence.log_id}
            for name, fence in sorted(self.by_pipeline.items())
        }
        return json.dumps({"pipelines": body}, sort_keys=True).encode()


def read_fences(path: Path) -> Fences:
    """Read the fence file (no file: no fence yet).

    Raises:
        FatalError: the file is empty or unreadable. It is never read as
            generation 0, which would let every stale writer back in.
    """
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return Fences()
    try:
        text = raw.decode().strip()
        if text.isdigit():
            # The older format: one generation for every pipeline of the sink.
            return Fences({_FLOOR: Fence(int(text))})
        fences = {
            str(name): Fence(int(entry["generation"]), entry.get("log_id"))
            for name, entry in json.loads(text)["pipelines"].items()
        }
        if any(f.generation < 0 for f in fences.values()):
            raise ValueError("negative generation")
        return Fences(fences)
    except (UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise FatalError(
            f"fence file {path} is empty or unreadable ({exc}: {raw[:100]!r}); it is not read "
            "as generation 0, which would let stale writers back in. Stop every writer of "
            "this sink, then replace the file with the newest generation of the pipeline's "
            "progress log (a plain integer is accepted).",
            path=str(path),
        ) from exc
