"""A store snapshot read in parts by key hash: merge-on-read with memory bounded by a part.

``Reading.snapshot`` reads every file of the snapshot into memory and merges
them; for a table of tens of millions of rows that is more memory than a
machine has. Here the files are streamed in record batches, each row is
spilled to the part its key hashes to (``reconcile.core.spill``), base rows and
change rows apart, and then each part is merged alone: a key's base row and all
its changes are in the same part, so each part's merge is exact.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]

from expected_state.evolved_files import iter_store_batches
from expected_state.layout import EPOCH_COLUMN, OP_COLUMN, StoreFile
from expected_state.merge import apply_changes
from reconcile.core import hooks, interrupts
from reconcile.core.contract import InvalidInputError
from reconcile.core.spill import SpilledParts, parts_of

__all__ = ["SPILLED", "read_in_parts"]

# Every file of the snapshot spilled, before the first part is merged.
SPILLED = hooks.declare("store.parts_spilled")


def read_in_parts(
    uri: str,
    files: Sequence[StoreFile],
    stored: pa.Schema,
    keys: Sequence[str],
    columns: Sequence[str],
    *,
    parts: int,
    where: str | None,
    epoch: int | None,
) -> Iterator[tuple[int, pa.Table]]:
    """Each part's state, ``(part, rows with columns)``, after spilling every file once.

    Args:
        uri: the store table's root.
        files: the snapshot's files, base first, then change files oldest epoch
            first (the order ``live_files`` gives, which the merge relies on).
        stored: the table's whole stored schema; the keys, ``columns``,
            ``_epoch`` and ``_op`` are read (files written before a column was
            added through ``expected_state.evolved_files``).
        keys: the key columns.
        columns: the columns each part returns.
        parts: how many parts.
        where: the folder for the spilled parts (None: the system's temporary folder).
        epoch: the snapshot's epoch, for the message if a file is gone.
    """
    read = list(dict.fromkeys([*keys, *columns, EPOCH_COLUMN, OP_COLUMN]))
    schema = pa.schema([stored.field(c) for c in read])
    with (
        SpilledParts(schema, parts, where=where, name="store-base") as base,
        SpilledParts(schema, parts, where=where, name="store-changes") as changes,
    ):
        for file in files:
            spill = base if file.kind == "base" else changes
            try:
                for batch in iter_store_batches(uri, file.path, columns=schema.names,
                                                stored=stored):  # fmt: skip
                    # A signal the command's guard remembered ends the read here, also
                    # where it runs on a thread of its own (recovery's read-ahead).
                    interrupts.check()
                    spill.add(batch, parts_of(batch, keys, parts))
            except (OSError, FileNotFoundError) as exc:
                raise InvalidInputError(
                    f"table {uri!r}: the files of epoch {epoch} are gone (vacuumed?): {exc}",
                    table=uri,
                    epoch=epoch,
                ) from exc
        hooks.point(SPILLED)
        for part in range(parts):
            state = apply_changes(base.read(part), changes.read(part), list(keys))
            yield part, state.select(list(columns))
