"""Buckets mode: compare per-range counts and checksums, bisect the ranges that differ, pull those.

The expected rows are sorted by the first key column and cut into ranges of
about equal size; the bounds are values of that column, so both sides put a row
in the same range (``width_bucket`` in SQL, ``searchsorted`` here). For every
range the database computes (rows, sum of row checksums) from the values it
holds (``reconcile.checksum``); the same figures are computed here from the
expected rows. A range whose figures differ is cut again (``fanout`` parts)
while it holds more than ``leaf_rows`` expected rows and can be cut; the ranges
left are pulled and diffed by row hash like full mode, so the counts are the
same as full mode's.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
import pyarrow.compute as pc  # type: ignore[import-untyped, unused-ignore]

from reconcile.checksum import row_checksums
from reconcile.recovery.target import KeyRange, SinkSnapshot

__all__ = ["BucketSearch", "find_differing_ranges"]


@dataclass
class BucketSearch:
    """What a bucket search compared and found.

    Attributes:
        compared: checksums compared (every level).
        differing: ranges whose checksums differed (every level).
        leaves: the differing ranges that were pulled, with the positions of
            their expected rows in the sorted expected table.
    """

    compared: int = 0
    differing: int = 0
    leaves: list[tuple[KeyRange, int, int]] = field(default_factory=list)


def _value(column: pa.ChunkedArray | pa.Array, i: int) -> Any:
    return column[i].as_py()


def _first_position(column: pa.Array, value: Any, lo: int, hi: int) -> int:
    """The first index in ``[lo, hi)`` of the sorted ``column`` whose value is >= ``value``."""
    while lo < hi:
        mid = (lo + hi) // 2
        if column[mid].as_py() < value:
            lo = mid + 1
        else:
            hi = mid
    return lo


def _cut(column: pa.Array, start: int, stop: int, parts: int) -> tuple[list[Any], list[int]]:
    """Bounds that cut sorted rows ``[start, stop)`` into about ``parts`` ranges.

    Returns the bounds (distinct values, each above the first row's) and the
    position of the first row of each range after the first.
    """
    bounds: list[Any] = []
    positions: list[int] = []
    first = _value(column, start)
    for j in range(1, parts):
        rank = start + (stop - start) * j // parts
        value = _value(column, rank)
        if value == first or (bounds and value == bounds[-1]):
            continue
        lo = positions[-1] if positions else start
        bounds.append(value)
        positions.append(_first_position(column, value, lo, rank + 1))
    return bounds, positions


def _expected_sums(
    sums: npt.NDArray[np.uint64], start: int, stop: int, positions: Sequence[int]
) -> list[tuple[int, int]]:
    edges = [start, *positions, stop]
    out = []
    for a, b in itertools.pairwise(edges):
        total = int(np.sum(sums[a:b], dtype=np.uint64)) if b > a else 0
        out.append((b - a, total))
    return out


def find_differing_ranges(
    snap: SinkSnapshot,
    expected: pa.Table,
    checksum_columns: Sequence[tuple[str, str]],
    first_key: str,
    *,
    first_level: int = 1024,
    fanout: int = 32,
    leaf_rows: int = 256,
) -> BucketSearch:
    """Compare checksums range by range and return the differing ranges to pull.

    Args:
        snap: the sink's snapshot (computes the database side).
        expected: the expected rows, SORTED by ``first_key`` ascending.
        checksum_columns: (column, sink type name) of every checksummed column.
        first_key: the first key column.
        first_level: ranges compared first.
        fanout: ranges a differing range is cut into.
        leaf_rows: a differing range with at most this many expected rows is
            pulled rather than cut again.
    """
    column = expected.column(first_key).combine_chunks()
    search = BucketSearch()
    if expected.num_rows == 0:
        # Nothing expected: any row the sink holds is extra; one range is all.
        found = snap.bucket_sums([], KeyRange())
        search.compared = 1
        if found:
            search.differing = 1
            search.leaves.append((KeyRange(), 0, 0))
        return search
    stack: list[tuple[KeyRange, int, int, int]] = [(KeyRange(), 0, expected.num_rows, first_level)]
    top: dict[int, tuple[int, int]] | None
    top_bounds, top_positions = _cut(column, 0, expected.num_rows, first_level)
    with ThreadPoolExecutor(max_workers=1) as pool:
        # The database scans the whole table for the first level while the
        # expected side's checksums are computed here: the two overlap.
        first: Future[dict[int, tuple[int, int]]] = pool.submit(
            snap.bucket_sums, top_bounds, KeyRange()
        )
        sums = row_checksums(expected, checksum_columns)
        top = first.result()
    while stack:
        within, start, stop, parts = stack.pop()
        if top is not None:
            bounds, positions, theirs, top = top_bounds, top_positions, top, None
        else:
            bounds, positions = _cut(column, start, stop, parts)
            theirs = snap.bucket_sums(bounds, within)
        mine = _expected_sums(sums, start, stop, positions)
        search.compared += len(mine)
        edges = [start, *positions, stop]
        lows = [within.lo, *bounds]
        highs = [*bounds, within.hi]
        for b in range(len(mine)):
            if theirs.get(b, (0, 0)) == mine[b]:
                continue
            search.differing += 1
            sub = KeyRange(lows[b], highs[b])
            rows = edges[b + 1] - edges[b]
            # Cut again only where it can help: enough rows, and more than one
            # distinct first-key value among them.
            can_cut = rows > leaf_rows and (
                _value(column, edges[b]) != _value(column, edges[b + 1] - 1)
            )
            if can_cut:
                stack.append((sub, edges[b], edges[b + 1], fanout))
            else:
                search.leaves.append((sub, edges[b], edges[b + 1]))
        # Rows the sink holds outside every expected range (below the first
        # bound it is bucket 0; above the last, the last bucket) are caught by
        # those buckets' counts; nothing else can hold them.
    return search


def sort_expected(expected: pa.Table, first_key: str) -> pa.Table:
    """The expected rows sorted by the first key column (byte order for strings)."""
    order = pc.sort_indices(expected, sort_keys=[(first_key, "ascending")])
    return expected.take(order)
