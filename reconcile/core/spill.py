"""Rows spread over a fixed number of parts by a hash of their key, spilled to disk part by part.

What bounded-memory work over a whole table goes through (a full verify, a
repair): both sides of a diff are streamed in record batches and each batch's
rows are appended to the part their key hashes to, so that every key's rows,
from either side and from every file of the store, land in the same part. Then
the parts are read back one at a time: the peak memory is one part, set by the
number of parts, not by the table.

The part of a key is the canonical row hash (``reconcile.core.hashing``) of its
key columns, modulo the number of parts. Equal keys of the same Arrow types
hash alike; the callers cast the keys of both sides to the expected state's
types first (a sink's ``int4`` key pulled as int32 hashes unlike the store's
int64).

A part is an Arrow IPC stream file (uncompressed: it is written and read once,
on the same machine, and the columns are mostly keys and hashes). Python's
``tempfile`` makes the folder; closing the set removes it, on an error or an
interruption too.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]

from reconcile.core.contract import InvalidInputError
from reconcile.core.hashing import row_hash_arrow

__all__ = ["SpilledParts", "parts_for", "parts_of"]


def parts_for(rows: int, chunk_rows: int) -> int:
    """How many parts keep each at about ``chunk_rows`` rows (at least one).

    Raises:
        InvalidInputError: ``chunk_rows`` is not a positive number of rows.
    """
    if chunk_rows < 1:
        raise InvalidInputError(f"chunk_rows must be a positive number of rows, got {chunk_rows}")
    return max(1, -(-max(rows, 0) // chunk_rows))


def parts_of(rows: pa.Table | pa.RecordBatch, keys: Sequence[str], parts: int) -> npt.NDArray[Any]:
    """The part (0 to ``parts`` - 1) of each row, from the hash of its key columns."""
    if parts == 1 or rows.num_rows == 0:
        return np.zeros(rows.num_rows, dtype=np.int64)
    hashes: npt.NDArray[np.uint64] = row_hash_arrow(rows, list(keys)).to_numpy().view(np.uint64)
    part: npt.NDArray[np.int64] = (hashes % np.uint64(parts)).astype(np.int64)
    return part


class SpilledParts:
    """``parts`` Arrow IPC files of one schema under a temporary folder.

    Args:
        schema: the rows' schema (every part has it, an empty part too).
        parts: how many parts.
        where: the folder to make the temporary folder in (default: the system's).
        name: what the rows are, for the folder's name (``reconcile-spill-NAME-``).
    """

    def __init__(self, schema: pa.Schema, parts: int, *, where: str | None = None,
                 name: str = "rows") -> None:  # fmt: skip
        self.schema, self.parts = schema, parts
        self.folder = Path(tempfile.mkdtemp(prefix=f"reconcile-spill-{name}-", dir=where))
        self._writers: list[Any] = [None] * parts
        self.rows = 0

    def _path(self, part: int) -> Path:
        return self.folder / f"part-{part:05d}.arrow"

    def add(self, rows: pa.Table | pa.RecordBatch, part: npt.NDArray[Any]) -> None:
        """Append each row to its part (``part[i]`` is row ``i``'s)."""
        if rows.num_rows == 0:
            return
        table = rows if isinstance(rows, pa.Table) else pa.Table.from_batches([rows])
        table = table.select(self.schema.names).cast(self.schema)
        self.rows += table.num_rows
        if self.parts == 1:
            self._write(0, table)
            return
        # One stable sort by part, then one slice per part present: a take per
        # part would read the batch once for each part.
        order = np.argsort(part, kind="stable")
        ordered = table.take(pa.array(order))
        sorted_parts = part[order]
        present, starts = np.unique(sorted_parts, return_index=True)
        ends = [*starts[1:], len(sorted_parts)]
        for p, start, end in zip(present, starts, ends, strict=True):
            self._write(int(p), ordered.slice(int(start), int(end - start)))

    def _write(self, part: int, table: pa.Table) -> None:
        writer = self._writers[part]
        if writer is None:
            writer = pa.ipc.new_stream(str(self._path(part)), self.schema)
            self._writers[part] = writer
        writer.write_table(table)

    def finish(self) -> None:
        """Close every part's file (before reading any)."""
        for i, writer in enumerate(self._writers):
            if writer is not None:
                writer.close()
                self._writers[i] = None

    def read(self, part: int) -> pa.Table:
        """One part's rows, in the order they were added."""
        self.finish()
        path = self._path(part)
        if not path.exists():
            return self.schema.empty_table()
        with pa.ipc.open_stream(pa.memory_map(str(path))) as reader:
            table: pa.Table = reader.read_all()
        # The part is read into memory whole: the file can go at once.
        path.unlink()
        return table

    def each(self) -> Iterator[tuple[int, pa.Table]]:
        """Every part in turn, ``(part, rows)``; each file is removed once read."""
        for part in range(self.parts):
            yield part, self.read(part)

    def close(self) -> None:
        """Close the files and remove the folder."""
        try:
            self.finish()
        finally:
            self._writers = [None] * self.parts
            shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> SpilledParts:
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None,
                 tb: TracebackType | None) -> None:  # fmt: skip
        self.close()
