"""The expected side of a first bucket search, read in parts: the first level's bounds and figures.

Without a kept summary, a bucket search needs the first level's bounds (cut
from the sorted first key of every expected row) and, per range, the expected
(rows, sum of row checksums). Reading the whole snapshot for that holds every
column of every row at once: 4 GB for TPC-H ``lineitem`` at scale 1. Here the
snapshot is read in parts by key hash (``ExpectedStore.snapshot_parts``, which
spills to disk), in two passes:

- ``sorted_first_keys``: the first key column alone, sorted (about 8 bytes a
  row for an integer key), from which the bounds are cut exactly as from the
  rows read whole; it is dropped once they are cut;
- ``part_figures``: every column, part by part; each part's rows are
  checksummed and added to their range's figures at once, so that nothing of
  table size is held, and the database's scan of the table runs meanwhile.

The figures are then those a kept summary holds, and the search goes on as it
does from one (``buckets.search_from_figures``): the rows of the ranges that
differ are read by range (``ExpectedStore.snapshot(ranges=...)``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
import pyarrow.compute as pc  # type: ignore[import-untyped, unused-ignore]

from reconcile.core import hooks, interrupts
from reconcile.core.checksum import row_checksums
from reconcile.core.contract import InvalidInputError
from reconcile.core.expected import ExpectedStore
from reconcile.recovery.summary import bucket_index

__all__ = ["FIGURES_PART", "part_figures", "sorted_first_keys"]

log = logging.getLogger("reconcile.recovery")

FIGURES_PART = hooks.declare("recovery.bucket_part")


def sorted_first_keys(
    store: ExpectedStore, epoch: int, first_key: str, *, parts: int, where: str | None
) -> pa.Array:
    """The first key column of every expected row at ``epoch``, sorted ascending.

    The order ``buckets.sort_expected`` gives the rows read whole (byte order
    for strings), so that the ranges cut from it are the same.

    Raises:
        InvalidInputError: an expected row whose first key is NULL.
    """
    schema = store.user_schema
    typ = schema.field(first_key).type if schema is not None else pa.int64()
    read = store.snapshot_parts(epoch, [first_key], parts=parts, where=where)
    if pa.types.is_integer(typ):
        # An integer key is copied part by part into one array and sorted in
        # place: one copy of the column at most (joining the parts' chunks, then
        # Arrow's sort_indices and take, would hold four: 1.9 GB at 60M rows).
        # The store's row count bounds the snapshot's; pages never written are
        # never resident.
        values = np.empty(store.stored_rows(epoch), dtype=typ.to_pandas_dtype())
        held = 0
        for _, part in read:
            interrupts.check()
            column = part.column(first_key)
            if column.null_count:
                raise _null_key(store, first_key)
            values[held : held + len(column)] = column.to_numpy()
            held += len(column)
        kept = values[:held]
        kept.sort()
        return pa.array(kept, typ)
    chunks: list[pa.Array] = []
    for _, part in read:
        # Between parts: a signal whose exception a library swallowed is raised here.
        interrupts.check()
        chunks.extend(part.column(first_key).chunks)
    column = pa.chunked_array(chunks, typ).combine_chunks()
    del chunks
    if column.null_count:
        raise _null_key(store, first_key)
    return column.take(pc.sort_indices(column))


def _null_key(store: ExpectedStore, first_key: str) -> InvalidInputError:
    return InvalidInputError(
        f"table {store.uri!r}: an expected row has a NULL in its first key column {first_key!r}",
        table=store.uri,
        column=first_key,
    )


def part_figures(
    store: ExpectedStore,
    epoch: int,
    checksum_columns: Sequence[tuple[str, str]],
    first_key: str,
    bounds: list[Any],
    *,
    parts: int,
    where: str | None,
    stop: threading.Event | None = None,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.uint64]]:
    """Expected (rows, sum of row checksums modulo 2**64) per range of ``bounds``, read in parts.

    Range ``i`` holds the rows with ``bounds[i-1] <= first key < bounds[i]``
    (``width_bucket``'s numbering, as the database counts them).

    Args:
        stop: set by the caller when the figures are no longer wanted (its own
            query failed): the read ends at the next part.
    """
    names = [name for name, _ in checksum_columns]
    rows = np.zeros(len(bounds) + 1, dtype=np.int64)
    sums = np.zeros(len(bounds) + 1, dtype=np.uint64)
    log.info("bucket search: the expected checksums in %d parts, spilled under %s", parts,
             where or "the temporary folder")  # fmt: skip
    for _, part in store.snapshot_parts(epoch, names, parts=parts, where=where):
        interrupts.check()
        if stop is not None and stop.is_set():
            break
        hooks.point(FIGURES_PART)
        if part.num_rows == 0:
            continue
        # Each row's range, and its checksum added there: the part is dropped after.
        where_in = bucket_index(part.column(first_key), bounds)
        rows += np.bincount(where_in, minlength=len(rows))
        with np.errstate(over="ignore"):
            np.add.at(sums, where_in, row_checksums(part, checksum_columns))
    return rows, sums
