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

import bisect
import itertools
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
import pyarrow.compute as pc  # type: ignore[import-untyped, unused-ignore]

from reconcile.checksum import row_checksums
from reconcile.recovery.target import KeyRange, SinkSnapshot

__all__ = [
    "BucketSearch",
    "cut_bounds",
    "find_differing_ranges",
    "first_position",
    "range_figures",
    "search_from_summary",
    "sort_expected",
]


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
    # The first level's bounds and expected (rows, checksum) per range, when
    # computed from the expected rows.
    top: tuple[list[Any], list[tuple[int, int]]] | None = None


def _value(column: pa.ChunkedArray | pa.Array, i: int) -> Any:
    return column[i].as_py()


def first_position(column: pa.Array, value: Any, lo: int, hi: int) -> int:
    """The first index in ``[lo, hi)`` of the sorted ``column`` whose value is >= ``value``."""
    while lo < hi:
        mid = (lo + hi) // 2
        if column[mid].as_py() < value:
            lo = mid + 1
        else:
            hi = mid
    return lo


def cut_bounds(column: pa.Array, start: int, stop: int, parts: int) -> tuple[list[Any], list[int]]:
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
        positions.append(first_position(column, value, lo, rank + 1))
    return bounds, positions


def range_figures(
    sums: npt.NDArray[np.uint64], start: int, stop: int, positions: Sequence[int]
) -> list[tuple[int, int]]:
    edges = [start, *positions, stop]
    out = []
    for a, b in itertools.pairwise(edges):
        total = int(np.sum(sums[a:b], dtype=np.uint64)) if b > a else 0
        out.append((b - a, total))
    return out


@dataclass
class _Walk:
    """The state of one search: the sorted expected rows, their checksums, what is left."""

    snap: SinkSnapshot
    column: pa.Array  # the first key column of the sorted expected rows
    sums: npt.NDArray[np.uint64]  # their row checksums
    fanout: int
    leaf_rows: int
    search: BucketSearch
    stack: list[tuple[KeyRange, int, int, int]] = field(default_factory=list)

    def differs(self, within: KeyRange, start: int, stop: int) -> None:
        """Range ``within`` (expected rows ``[start, stop)``) differs: cut it again, or pull it."""
        self.search.differing += 1
        rows = stop - start
        # Cut again only where it can help: enough rows, and more than one
        # distinct first-key value among them.
        can_cut = rows > self.leaf_rows and (
            _value(self.column, start) != _value(self.column, stop - 1)
        )
        if can_cut:
            self.stack.append((within, start, stop, self.fanout))
        else:
            self.search.leaves.append((within, start, stop))

    def compare(
        self,
        within: KeyRange,
        bounds: list[Any],
        edges: list[int],
        mine: list[tuple[int, int]],
        theirs: dict[int, tuple[int, int]],
    ) -> None:
        """Compare one level's figures, bucket by bucket."""
        self.search.compared += len(mine)
        lows = [within.lo, *bounds]
        highs = [*bounds, within.hi]
        for b in range(len(mine)):
            if theirs.get(b, (0, 0)) != mine[b]:
                self.differs(KeyRange(lows[b], highs[b]), edges[b], edges[b + 1])
        # Rows the sink holds outside every expected range (below the first
        # bound it is bucket 0; above the last, the last bucket) are caught by
        # those buckets' counts; nothing else can hold them.

    def descend(self) -> BucketSearch:
        """Cut and compare the differing ranges until every one left is a leaf to pull.

        Level by level: the database computes the figures of every range cut at
        one level in ONE query (the ranges are disjoint, so the union of their
        edges numbers every sub-range apart), so the round trips follow the
        depth of the search, not the number of ranges that differ.
        """
        while self.stack:
            level, self.stack = sorted(self.stack, key=lambda item: item[1]), []
            cuts = [cut_bounds(self.column, start, stop, parts) for _, start, stop, parts in level]
            edges = sorted(
                {v for (within, *_), (bounds, _) in zip(level, cuts, strict=True)
                 for v in (within.lo, *bounds, within.hi) if v is not None}
            )  # fmt: skip
            found = self.snap.bucket_sums(edges, [within for within, *_ in level])
            for (within, start, stop, _), (bounds, positions) in zip(level, cuts, strict=True):
                # Sub-range j starts at its edge e_j: the union's bucket numbering
                # gives it the number of union edges at or below e_j.
                lows = [within.lo, *bounds]
                theirs = {
                    j: found.get(0 if lo is None else bisect.bisect_right(edges, lo), (0, 0))
                    for j, lo in enumerate(lows)
                }
                mine = range_figures(self.sums, start, stop, positions)
                self.compare(within, bounds, [start, *positions, stop], mine, theirs)
        return self.search


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

    Returns:
        The search, with the first level's bounds and expected figures (what a
        ``BucketSummary`` keeps for the next search).
    """
    column = expected.column(first_key).combine_chunks()
    search = BucketSearch()
    if expected.num_rows == 0:
        # Nothing expected: any row the sink holds is extra; one range is all.
        found = snap.bucket_sums([], [KeyRange()])
        search.compared = 1
        if found:
            search.differing = 1
            search.leaves.append((KeyRange(), 0, 0))
        return search
    bounds, positions = cut_bounds(column, 0, expected.num_rows, first_level)
    with ThreadPoolExecutor(max_workers=1) as pool:
        # The database scans the whole table for the first level while the
        # expected side's checksums are computed here: the two overlap.
        first: Future[dict[int, tuple[int, int]]] = pool.submit(
            snap.bucket_sums, bounds, [KeyRange()]
        )
        sums = row_checksums(expected, checksum_columns)
        theirs = first.result()
    walk = _Walk(snap, column, sums, fanout, leaf_rows, search)
    edges = [0, *positions, expected.num_rows]
    mine = range_figures(sums, 0, expected.num_rows, positions)
    search.top = (bounds, mine)
    walk.compare(KeyRange(), bounds, edges, mine, theirs)
    return walk.descend()


def search_from_summary(
    snap: SinkSnapshot,
    bounds: list[Any],
    figures: list[tuple[int, int]],
    read_ranges: Callable[[list[KeyRange]], pa.Table],
    checksum_columns: Sequence[tuple[str, str]],
    first_key: str,
    *,
    fanout: int = 32,
    leaf_rows: int = 256,
) -> tuple[BucketSearch, pa.Table] | None:
    """The same search, with the first level's expected figures kept from an earlier one.

    Only the database scans the whole table; the expected rows are read, and
    their checksums computed, for the first-level ranges that differ only.

    Args:
        bounds, figures: the first level's bounds and expected (rows, checksum)
            per range, as of the target epoch (``BucketSummary``).
        read_ranges: reads the expected rows of some ranges (any order).

    Returns:
        The search and the expected rows it read (sorted), or None when those
        rows do not add up to the kept figures: the summary is wrong, and the
        caller searches from the expected rows instead.
    """
    search = BucketSearch()
    theirs = snap.bucket_sums(bounds, [KeyRange()])
    search.compared = len(figures)
    lows = [None, *bounds]
    highs = [*bounds, None]
    differing = [b for b in range(len(figures)) if theirs.get(b, (0, 0)) != figures[b]]
    ranges = [KeyRange(lows[b], highs[b]) for b in differing]
    expected = sort_expected(read_ranges(ranges), first_key)
    column = expected.column(first_key).combine_chunks()
    sums = row_checksums(expected, checksum_columns)
    walk = _Walk(snap, column, sums, fanout, leaf_rows, search)
    for b, within in zip(differing, ranges, strict=True):
        start = 0 if within.lo is None else first_position(column, within.lo, 0, len(column))
        stop = (
            len(column)
            if within.hi is None
            else first_position(column, within.hi, start, len(column))
        )
        mine = range_figures(sums, start, stop, [])[0]
        if mine != figures[b]:
            # The rows read here are the expected state; the kept figures
            # disagree, so they are not: never trust them for the other ranges.
            return None
        walk.differs(within, start, stop)
    return walk.descend(), expected


def sort_expected(expected: pa.Table, first_key: str) -> pa.Table:
    """The expected rows sorted by the first key column (byte order for strings)."""
    order = pc.sort_indices(expected, sort_keys=[(first_key, "ascending")])
    return expected.take(order)
