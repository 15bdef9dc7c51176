"""Key ranges as data, and when buckets mode gives way to full: the pure parts, without a server.

The SQL these feed is checked against a real server in
``tests/integration/test_range_queries.py``; here, that a range cut at bounds
numbers its pieces as ``width_bucket`` numbers rows, that the scan plan's map
sends every bucket of edges to the piece that holds it, that the query's text
is the same for ten ranges and ten thousand, and where the cost rule draws its
line.
"""

from __future__ import annotations

import bisect
import random

import pytest
from psycopg import sql

from reconcile.core.target import KeyRange
from reconcile.recovery.buckets import FULL_SHARE, dearer_than_full
from sinks.postgres.ranges import (
    Params,
    RangeOrder,
    _scan_map,
    pieces_of,
    ranges_sql,
    split_by_bounds,
)


def covering_piece(pieces: list[tuple[object, object, int]], value: int) -> int | None:
    for lo, hi, b in pieces:
        if (lo is None or lo <= value) and (hi is None or value < hi):
            return b
    return None


@pytest.mark.parametrize("seed", range(30))
def test_pieces_are_numbered_as_width_bucket_numbers_their_rows(seed: int) -> None:
    rng = random.Random(seed)
    bounds = sorted(rng.sample(range(1000), rng.randint(0, 30)))
    cuts = sorted(rng.sample(range(1, 1000), rng.randint(1, 12)))
    edges: list[int | None] = [None, *cuts, None]
    within = [KeyRange(edges[i], edges[i + 1]) for i in range(len(edges) - 1)]
    within = [r for r in within if rng.random() < 0.6]
    pieces = split_by_bounds(bounds, within).ranges
    for value in range(-5, 1005):
        inside = any(
            (r.lo is None or r.lo <= value) and (r.hi is None or value < r.hi) for r in within
        )
        got = covering_piece(pieces, value)
        assert (got is not None) == inside, value
        if inside:
            assert got == bisect.bisect_right(bounds, value), value
    # Pieces are disjoint: no value is in two of them.
    for value in range(0, 1000, 7):
        assert sum(covering_piece([p], value) is not None for p in pieces) <= 1


@pytest.mark.parametrize("seed", range(30))
def test_the_scan_map_sends_every_value_to_its_piece(seed: int) -> None:
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, 500), rng.randint(1, 20)))
    edges: list[int | None] = [None, *cuts, None]
    ranges = [KeyRange(edges[i], edges[i + 1]) for i in range(len(edges) - 1)]
    chosen = [r for r in ranges if rng.random() < 0.5]
    ids = [rng.randint(0, 99) for _ in chosen]
    pieces = pieces_of(chosen, ids)
    texts, mapped = _scan_map(pieces)
    values = [int(t) for t in texts]
    for value in range(-3, 503):
        bucket = bisect.bisect_right(values, value)  # width_bucket's number
        want = covering_piece(pieces.ranges, value)
        assert mapped[bucket] == (None if want is None else str(want)), value


def test_pieces_keep_the_unbounded_ends_apart() -> None:
    pieces = pieces_of([KeyRange(None, 5), KeyRange(7, 9), KeyRange(12, None)], [3, 4, 5])
    assert pieces.head == ("5", 3) and pieces.tail == ("12", 5)
    assert (pieces.lows, pieces.highs, pieces.ids) == (["7"], ["9"], ["4"])
    assert pieces_of([KeyRange()], [1]).whole == 1


def _text(ranges: list[KeyRange], indexed: bool, tagged: bool) -> tuple[str, int]:
    order = RangeOrder(sql.Identifier("t", "id"), sql.SQL("bigint"), indexed)
    params = Params()
    query = ranges_sql(
        order,
        sql.Identifier("public", "big"),
        sql.SQL("t.id"),
        pieces_of(ranges, list(range(len(ranges)))),
        params,
        tagged=tagged,
    )
    return query.as_string(None), len(params.values)


@pytest.mark.parametrize("indexed", [True, False])
@pytest.mark.parametrize("tagged", [True, False])
def test_the_query_text_is_the_same_for_ten_ranges_and_ten_thousand(
    indexed: bool, tagged: bool
) -> None:
    def ranges(n: int) -> list[KeyRange]:
        inner = [KeyRange(10 * i, 10 * i + 5) for i in range(1, n - 1)]
        return [KeyRange(None, 3), *inner, KeyRange(10 * n, None)]

    few, few_params = _text(ranges(10), indexed, tagged)
    many, many_params = _text(ranges(10_000), indexed, tagged)
    assert few == many and few_params == many_params
    assert len(many) < 1_000


def test_full_mode_takes_over_past_the_share_of_rows_in_differing_ranges() -> None:
    mine = [(100, 1)] * 10
    theirs = {b: (100, 1) for b in range(10)}
    assert dearer_than_full(mine, theirs, [], FULL_SHARE) is None
    # Exactly the share: buckets still go on; one row more: full mode.
    assert dearer_than_full(mine, theirs, [0, 1], 0.2) is None
    theirs[1] = (101, 2)
    reason = dearer_than_full(mine, theirs, [0, 1], 0.2)
    assert reason is not None and "2 of 10" in reason and "20%" in reason
    # A range the sink filled with rows the store lacks costs its sink rows.
    assert dearer_than_full(mine, {0: (5000, 9)}, [0], 0.2) is not None
    # Nothing on either side: nothing to weigh.
    assert dearer_than_full([(0, 0)], {}, [], 0.2) is None
