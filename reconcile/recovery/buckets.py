"""Buckets mode: compare per-range counts and checksums, bisect the ranges that differ, pull those.

The expected rows are sorted by the first key column and cut into ranges of
about equal size; the bounds are values of that column, so both sides put a row
in the same range (``width_bucket`` in SQL, ``searchsorted`` here). For every
range the database computes (rows, sum of row checksums) from the values it
holds (``reconcile.core.checksum``); the same figures are computed here from the
expected rows. A range whose figures differ is cut again (``fanout`` parts)
while it holds more than ``leaf_rows`` expected rows and can be cut; the ranges
left are pulled and diffed by row hash like full mode, so the counts are the
same as full mode's.

What the search costs, and when it gives way to full mode (``BucketLimits``):

- the first level costs one scan of the table in the database (and the
  expected rows' checksums here, unless a summary keeps them);
- every deeper level checksums the rows of the ranges that differed, and the
  leaves are pulled: both cost about the rows in the differing ranges, through
  the key's index (the ranges travel as data, never as SQL text);
- so once the first level's figures are in, the rows in its differing ranges
  (the larger of the expected and the sink's count, range by range) measure
  what going on would cost. Past ``full_share`` of the table's rows, pulling
  every row costs less, and the search stops: ``BucketSearch.dearer`` says why,
  and the caller runs full mode on the same snapshot;
- a level is cut only while the ranges it would compare stay within
  ``max_leaves``; past that, its differing ranges are pulled as they are;
- without an index that reads a key range (``SinkSnapshot.narrow_ranges``),
  every deeper level would scan the table again, so the first level's
  differing ranges are pulled as they are.
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

from reconcile.core.checksum import row_checksums
from reconcile.core.target import KeyRange, SinkSnapshot

__all__ = [
    "FULL_SHARE",
    "BucketLimits",
    "BucketSearch",
    "cut_bounds",
    "find_differing_ranges",
    "first_position",
    "range_figures",
    "search_from_summary",
    "search_sorted",
    "sort_expected",
]


# Past this share of the table's rows in the first level's differing ranges,
# full mode costs less than going on. Measured on 1.5M rows (2 cores,
# PostgreSQL 15, int8 key, drift every 100th key of the first N % of keys):
# going on (the deeper levels' checksums through the key's index, then the
# leaves' pull, hash and diff) cost about 4x per row in those ranges what full
# mode costs per row of the table (20 %: 6.3 s over a 9.5 s full run; 40 %:
# 11.5 to 17.5 s over 7.4 to 11.3 s). Break-even near 0.25; 0.2 leaves room
# for a heap that is not in key order (index reads then cost more).
FULL_SHARE = 0.2


@dataclass(frozen=True)
class BucketLimits:
    """How far a bucket search cuts, and when pulling every row costs less.

    Attributes:
        first_level: ranges compared first.
        fanout: ranges a differing range is cut into.
        leaf_rows: a differing range with at most this many expected rows is
            pulled rather than cut again.
        max_leaves: a level is cut only while the ranges it would compare stay
            at most this many; past it, its differing ranges are pulled.
        full_share: past this share of the table's rows in the first level's
            differing ranges, the search stops and full mode runs instead.
    """

    first_level: int = 1024
    fanout: int = 32
    leaf_rows: int = 256
    max_leaves: int = 16_384
    full_share: float = FULL_SHARE


@dataclass
class BucketSearch:
    """What a bucket search compared and found.

    Attributes:
        compared: checksums compared (every level).
        differing: ranges whose checksums differed (every level).
        leaves: the differing ranges that were pulled, with the positions of
            their expected rows in the sorted expected table.
        dearer: why pulling every row costs less than going on (the search
            stopped after its first level), or None.
    """

    compared: int = 0
    differing: int = 0
    leaves: list[tuple[KeyRange, int, int]] = field(default_factory=list)
    dearer: str | None = None
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


def dearer_than_full(
    mine: Sequence[tuple[int, int]],
    theirs: dict[int, tuple[int, int]],
    differing: Sequence[int],
    share: float,
) -> str | None:
    """Why full mode costs less than searching on from a first level, or None.

    Args:
        mine: expected (rows, checksum) per first-level range.
        theirs: the sink's (rows, checksum) per range (absent: none).
        differing: the ranges whose figures differ.
        share: ``BucketLimits.full_share``.
    """
    total = max(sum(n for n, _ in mine), sum(n for n, _ in theirs.values()))
    # A range costs what the larger side holds: the sink's rows are pulled,
    # the expected ones checksummed and diffed.
    rows = sum(max(mine[b][0], theirs.get(b, (0, 0))[0]) for b in differing)
    if total == 0 or rows <= share * total:
        return None
    return (
        f"{len(differing)} of {len(mine)} first-level key ranges differ, holding "
        f"{rows / total:.0%} of the rows (more than {share:.0%}): pulling every row costs less "
        "than checksumming and pulling those ranges"
    )


@dataclass
class _Walk:
    """The state of one search: the sorted expected rows, their checksums, what is left."""

    snap: SinkSnapshot
    column: pa.Array  # the first key column of the sorted expected rows
    sums: npt.NDArray[np.uint64]  # their row checksums
    limits: BucketLimits
    search: BucketSearch
    stack: list[tuple[KeyRange, int, int, int]] = field(default_factory=list)

    def differs(self, within: KeyRange, start: int, stop: int) -> None:
        """Range ``within`` (expected rows ``[start, stop)``) differs: cut it again, or pull it."""
        self.search.differing += 1
        rows = stop - start
        # Cut again only where it can help: enough rows, more than one distinct
        # first-key value among them, and an index that reads a range at the
        # cost of its rows (else every level would scan the table).
        can_cut = (
            rows > self.limits.leaf_rows
            and _value(self.column, start) != _value(self.column, stop - 1)
            and self.snap.narrow_ranges
        )
        if can_cut:
            self.stack.append((within, start, stop, self.limits.fanout))
        else:
            self.search.leaves.append((within, start, stop))

    def compare(
        self,
        within: KeyRange,
        bounds: list[Any],
        edges: list[int],
        mine: list[tuple[int, int]],
        theirs: dict[int, tuple[int, int]],
    ) -> list[int]:
        """Compare one level's figures, bucket by bucket; the buckets that differ."""
        self.search.compared += len(mine)
        lows = [within.lo, *bounds]
        highs = [*bounds, within.hi]
        differing = [b for b in range(len(mine)) if theirs.get(b, (0, 0)) != mine[b]]
        for b in differing:
            self.differs(KeyRange(lows[b], highs[b]), edges[b], edges[b + 1])
        # Rows the sink holds outside every expected range (below the first
        # bound it is bucket 0; above the last, the last bucket) are caught by
        # those buckets' counts; nothing else can hold them.
        return differing

    def descend(self) -> BucketSearch:
        """Cut and compare the differing ranges until every one left is a leaf to pull.

        Level by level: the database computes the figures of every range cut at
        one level in ONE query (the ranges are disjoint, so the union of their
        edges numbers every sub-range apart), so the round trips follow the
        depth of the search, not the number of ranges that differ.
        """
        while self.stack:
            level, self.stack = sorted(self.stack, key=lambda item: item[1]), []
            if sum(parts for *_, parts in level) > self.limits.max_leaves:
                # Cut again, this level would compare more ranges than the
                # cap: its ranges are pulled as they are (their rows are what
                # a deeper level would have checksummed anyway).
                self.search.leaves.extend((within, start, stop) for within, start, stop, _ in level)
                break
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
    limits: BucketLimits | None = None,
) -> BucketSearch:
    """Compare checksums range by range and return the differing ranges to pull.

    Args:
        snap: the sink's snapshot (computes the database side).
        expected: the expected rows, SORTED by ``first_key`` ascending.
        checksum_columns: (column, sink type name) of every checksummed column.
        first_key: the first key column.
        limits: how far to cut, and when full mode costs less.

    Returns:
        The search, with the first level's bounds and expected figures (what a
        ``BucketSummary`` keeps for the next search); ``dearer`` set when the
        first level's differing ranges hold too many rows to go on. Its leaves'
        positions are rows of ``expected``.
    """
    column = expected.column(first_key).combine_chunks()
    return search_sorted(snap, column, lambda: row_checksums(expected, checksum_columns), limits)


def search_sorted(
    snap: SinkSnapshot,
    column: pa.Array,
    checksums: Callable[[], npt.NDArray[np.uint64]],
    limits: BucketLimits | None = None,
) -> BucketSearch:
    """The search of ``find_differing_ranges``, from the expected rows' first key and checksums.

    Args:
        snap: the sink's snapshot (computes the database side).
        column: the expected rows' first key column, sorted ascending.
        checksums: computes their row checksums, in the same order (while the
            database scans the table for the first level).
        limits: how far to cut, and when full mode costs less.
    """
    limits = limits or BucketLimits()
    search = BucketSearch()
    rows = len(column)
    if rows == 0:
        # Nothing expected: any row the sink holds is extra; one range is all.
        found = snap.bucket_sums([], [KeyRange()])
        search.compared = 1
        if found:
            search.differing = 1
            search.leaves.append((KeyRange(), 0, 0))
        return search
    bounds, positions = cut_bounds(column, 0, rows, limits.first_level)
    with ThreadPoolExecutor(max_workers=1) as pool:
        # The database scans the whole table for the first level while the
        # expected side's checksums are computed in a worker: the two overlap.
        # The query waits in this (the caller's) thread, where a signal can
        # interrupt it and cancel it on the server; the worker's share is
        # bounded CPU work that the pool's exit waits for.
        ours: Future[npt.NDArray[np.uint64]] = pool.submit(checksums)
        theirs = snap.bucket_sums(bounds, [KeyRange()])
        sums = ours.result()
    walk = _Walk(snap, column, sums, limits, search)
    edges = [0, *positions, rows]
    mine = range_figures(sums, 0, rows, positions)
    search.top = (bounds, mine)
    differing = walk.compare(KeyRange(), bounds, edges, mine, theirs)
    search.dearer = dearer_than_full(mine, theirs, differing, limits.full_share)
    if search.dearer is not None:
        return search
    return walk.descend()


def search_from_summary(
    snap: SinkSnapshot,
    bounds: list[Any],
    figures: list[tuple[int, int]],
    read_ranges: Callable[[list[KeyRange]], pa.Table],
    checksum_columns: Sequence[tuple[str, str]],
    first_key: str,
    limits: BucketLimits | None = None,
    theirs: dict[int, tuple[int, int]] | None = None,
) -> tuple[BucketSearch, pa.Table] | None:
    """The same search, with the first level's expected figures kept from an earlier one.

    Only the database scans the whole table; the expected rows are read, and
    their checksums computed, for the first-level ranges that differ only.

    Args:
        bounds, figures: the first level's bounds and expected (rows, checksum)
            per range, as of the target epoch (``BucketSummary``, or computed
            in parts: ``bucket_parts.part_figures``).
        read_ranges: reads the expected rows of some ranges (any order).
        limits: how far to cut (its ``first_level`` is the summary's), and
            when full mode costs less.
        theirs: the database's figures for ``bounds`` over the whole table,
            when already computed (None: computed here).

    Returns:
        The search and the expected rows it read (sorted), or None when those
        rows do not add up to the kept figures: the summary is wrong, and the
        caller searches from the expected rows instead. When the differing
        ranges hold too many rows to go on, the search has ``dearer`` set and
        no expected row is read.
    """
    limits = limits or BucketLimits()
    search = BucketSearch()
    if theirs is None:
        theirs = snap.bucket_sums(bounds, [KeyRange()])
    search.compared = len(figures)
    lows = [None, *bounds]
    highs = [*bounds, None]
    differing = [b for b in range(len(figures)) if theirs.get(b, (0, 0)) != figures[b]]
    search.dearer = dearer_than_full(figures, theirs, differing, limits.full_share)
    if search.dearer is not None:
        search.differing = len(differing)  # (else each is counted as the walk meets it)
        return search, pa.table({})
    ranges = [KeyRange(lows[b], highs[b]) for b in differing]
    expected = sort_expected(read_ranges(ranges), first_key)
    column = expected.column(first_key).combine_chunks()
    sums = row_checksums(expected, checksum_columns)
    walk = _Walk(snap, column, sums, limits, search)
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
