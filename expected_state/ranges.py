"""Key ranges over a store table's rows: which values fall in a set of ``[lo, hi)`` ranges.

And the filter a snapshot of some keys or ranges applies to each batch it reads.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
import pyarrow.compute as pc  # type: ignore[import-untyped, unused-ignore]

from expected_state.merge import member_mask

__all__ = ["in_ranges", "row_filter", "sortable_numbers"]


def sortable_numbers(values: pa.Array | pa.ChunkedArray) -> np.ndarray[Any, Any] | None:
    """``values`` as a numpy array that sorts like them, or None for other types."""
    typ = values.type
    if pa.types.is_integer(typ) or pa.types.is_floating(typ):
        return np.asarray(values.to_numpy())
    if pa.types.is_timestamp(typ) or pa.types.is_date(typ) or pa.types.is_time(typ):
        width = pa.int32() if typ.bit_width == 32 else pa.int64()
        return np.asarray(pc.cast(values, width).to_numpy())
    return None


def in_ranges(column: pa.ChunkedArray, ranges: Sequence[tuple[Any, Any]]) -> pa.Array:
    """For each value of ``column``, whether it lies in one of the disjoint ``[lo, hi)`` ranges.

    None is unbounded on its side; a NULL value is in no range. Numbers, dates
    and times take one vectorized binary search over the sorted range starts;
    other types (text, decimals) compare range by range.
    """
    n = len(column)
    values = sortable_numbers(column) if column.null_count == 0 else None
    if values is not None and ranges:
        spans = sorted(ranges, key=lambda r: (r[0] is not None, r[0]))
        lows = sortable_numbers(pa.array([lo for lo, _ in spans if lo is not None], column.type))
        highs = sortable_numbers(pa.array([hi for _, hi in spans if hi is not None], column.type))
        assert lows is not None and highs is not None
        bounded_low = spans[0][0] is not None
        # The range each value would fall in: the last one starting at or below it.
        start = np.searchsorted(lows, values, side="right") - (1 if bounded_low else 0)
        open_top = np.array([hi is None for _, hi in spans])
        high_values = np.zeros(len(spans), dtype=values.dtype)
        high_values[~open_top] = highs
        chosen = np.maximum(start, 0)
        inside = (start >= 0) & (open_top[chosen] | (values < high_values[chosen]))
        return pa.array(inside)
    mask = np.zeros(n, dtype=bool)
    for lo, hi in ranges:
        inside = pc.is_valid(column)
        if lo is not None:
            inside = pc.and_(inside, pc.greater_equal(column, pa.scalar(lo, column.type)))
        if hi is not None:
            inside = pc.and_(inside, pc.less(column, pa.scalar(hi, column.type)))
        mask |= np.asarray(pc.fill_null(inside, False).to_numpy(zero_copy_only=False), dtype=bool)
    return pa.array(mask)


def row_filter(
    key_columns: Sequence[str], keys: pa.Table | None, ranges: Sequence[tuple[Any, Any]] | None
) -> Callable[[pa.Table], pa.Array]:
    """The filter of a snapshot of some keys and/or first-key ranges, for each batch read.

    A key's rows all share its key (and so its first-key value), so filtering
    the rows before the merge keeps every row the merge of those keys needs.
    The keys are made distinct once, and cast once per key schema the files
    hold (one, unless the store's types were widened), not at every batch.
    """
    names = list(key_columns)
    distinct = None if keys is None else keys.select(names).group_by(names).aggregate([])
    cast: dict[pa.Schema, pa.Table] = {}

    def keep(batch: pa.Table) -> pa.Array:
        mask = pa.array(np.ones(batch.num_rows, dtype=bool))
        if distinct is not None:
            schema = batch.select(names).schema
            if schema not in cast:
                cast[schema] = distinct.cast(schema).combine_chunks()
            mask = pc.and_(mask, member_mask(batch, cast[schema], names))
        if ranges is not None:
            mask = pc.and_(mask, in_ranges(batch.column(names[0]), ranges))
        return mask

    return keep
