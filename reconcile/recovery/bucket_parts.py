"""The expected side of a first bucket search, read in parts: the sorted first key and checksums.

Without a kept summary, a bucket search needs, for every expected row, its
first-key value (to cut the ranges) and its row checksum (to add up each
range's figure). Reading the whole snapshot for that holds every column of
every row at once: 4 GB for TPC-H ``lineitem`` at scale 1. Here the snapshot
is read in parts by key hash (``ExpectedStore.snapshot_parts``, which spills
to disk), each part is checksummed alone, and only those two columns are kept:
about 16 bytes a row for an integer key. The rows of the ranges that differ
are read afterwards, by range (``ExpectedStore.snapshot(ranges=...)``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
import pyarrow.compute as pc  # type: ignore[import-untyped, unused-ignore]

from reconcile.core import hooks, interrupts
from reconcile.core.checksum import row_checksums
from reconcile.core.expected import ExpectedStore

__all__ = ["FIGURES_PART", "sorted_checksums"]

log = logging.getLogger("reconcile.recovery")

FIGURES_PART = hooks.declare("recovery.bucket_part")


def sorted_checksums(
    store: ExpectedStore,
    epoch: int,
    checksum_columns: Sequence[tuple[str, str]],
    first_key: str,
    *,
    parts: int,
    where: str | None,
) -> tuple[pa.Array, npt.NDArray[np.uint64]]:
    """The first key column of every expected row at ``epoch``, sorted, and the rows' checksums.

    Args:
        store: the store table.
        epoch: the snapshot's epoch.
        checksum_columns: (column, sink type name) of every checksummed column.
        first_key: the first key column.
        parts: how many parts to read the snapshot in.
        where: the folder the parts are spilled to (None: the temporary folder).

    Returns:
        The sorted column and, in the same order, each row's checksum (what
        ``buckets.search_sorted`` takes).
    """
    names = [name for name, _ in checksum_columns]
    columns: list[pa.Array] = []
    sums: list[npt.NDArray[np.uint64]] = []
    log.info("bucket search: the expected checksums in %d parts, spilled under %s", parts,
             where or "the temporary folder")  # fmt: skip
    for _, part in store.snapshot_parts(epoch, names, parts=parts, where=where):
        # Between parts: a signal whose exception a library swallowed is raised here.
        interrupts.check()
        hooks.point(FIGURES_PART)
        columns.append(part.column(first_key).combine_chunks())
        sums.append(row_checksums(part, checksum_columns))
    column = pa.chunked_array(columns).combine_chunks()
    # The order sort_expected gives the rows read whole, so the ranges cut are the same.
    order = pc.sort_indices(column)
    return column.take(order), np.concatenate(sums)[order.to_numpy()]
