"""``in_ranges``: which values of a first-key column lie in some disjoint ``[lo, hi)`` ranges.

Buckets mode reads the expected rows of the ranges that differ through it, so a
value wrongly left out would be a row the search never compares. The vectorized
path (numbers, timestamps) and the range-by-range path (text) must both agree
with the plain definition, open ends and NULLs included.
"""

from __future__ import annotations

import datetime as dt
import itertools
from typing import Any

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from expected_state.ranges import in_ranges

_START = dt.datetime(2020, 1, 1, tzinfo=dt.UTC)
_KINDS: dict[str, tuple[Any, pa.DataType]] = {
    "int": (lambda x: x, pa.int64()),
    "text": (lambda x: f"{x + 100:04d}", pa.string()),
    "timestamp": (lambda x: _START + dt.timedelta(seconds=x), pa.timestamp("us", tz="UTC")),
    "date": (lambda x: (_START + dt.timedelta(days=x)).date(), pa.date32()),
}


@settings(max_examples=300, deadline=None)
@given(
    values=st.lists(st.one_of(st.none(), st.integers(-50, 50)), max_size=40),
    cuts=st.lists(st.integers(-60, 60), max_size=8, unique=True),
    open_low=st.booleans(),
    open_high=st.booleans(),
    kind=st.sampled_from(sorted(_KINDS)),
)
def test_in_ranges_is_the_plain_definition(
    values: list[int | None], cuts: list[int], open_low: bool, open_high: bool, kind: str
) -> None:
    convert, typ = _KINDS[kind]
    edges = sorted(cuts)
    spans: list[tuple[int | None, int | None]] = list(itertools.pairwise(edges))[::2]
    if spans and open_low:
        spans[0] = (None, spans[0][1])
    if spans and open_high:
        spans[-1] = (spans[-1][0], None)
    column = pa.chunked_array([pa.array([None if v is None else convert(v) for v in values], typ)])
    ranges = [
        (None if a is None else convert(a), None if b is None else convert(b)) for a, b in spans
    ]
    want = [
        v is not None and any((a is None or v >= a) and (b is None or v < b) for a, b in spans)
        for v in values
    ]
    assert in_ranges(column, ranges).to_pylist() == want


def test_a_value_at_an_upper_bound_is_outside_on_the_vectorized_path() -> None:
    """No NULLs (the vectorized path), values on every bound: [lo, hi) keeps lo, drops hi."""
    for kind in ("int", "timestamp", "date"):
        convert, typ = _KINDS[kind]
        column = pa.chunked_array([pa.array([convert(v) for v in (-5, 0, 4, 5, 9, 10, 20)], typ)])
        ranges = [(convert(0), convert(5)), (convert(9), convert(10))]
        got = in_ranges(column, ranges).to_pylist()
        assert got == [False, True, True, False, True, False, False], kind
