"""Merge-on-read in Arrow: the newest change of each key wins, and a delete leaves no row.

The rule, for any set of rows read from a store table (a base and change
files, or everything a plain Delta reader returns): group the rows by key,
keep the row with the highest ``_epoch``, and drop it if its ``_op`` is
``"delete"``. Every function here is vectorized (Arrow compute, numpy); none
loops over rows in Python.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
import pyarrow.compute as pc  # type: ignore[import-untyped, unused-ignore]

from expected_state.layout import EPOCH_COLUMN, OP_COLUMN, ROW_HASH_COLUMN
from reconcile.core.keys import all_distinct

__all__ = ["apply_changes", "last_per_key", "member_mask", "resolve"]


def member_mask(data: pa.Table, keys: pa.Table, columns: Sequence[str]) -> pa.Array:
    """For each row of ``data``, whether its key is among ``keys``."""
    if len(columns) == 1:
        return pc.fill_null(
            pc.is_in(data.column(columns[0]), value_set=keys.column(columns[0]).combine_chunks()),
            False,
        )
    indexed = data.select(list(columns)).append_column(
        "_row", pa.array(np.arange(data.num_rows, dtype=np.int64))
    )
    hits = indexed.join(keys.select(list(columns)).group_by(list(columns)).aggregate([]),
                        keys=list(columns), join_type="left semi")  # fmt: skip
    mask = np.zeros(data.num_rows, dtype=bool)
    mask[hits.column("_row").to_numpy()] = True
    return pa.array(mask)


def last_per_key(data: pa.Table, keys: Sequence[str]) -> pa.Table:
    """Keep the last row of every key; the order of ``data`` decides which is last."""
    if data.num_rows <= 1:
        return data
    if len(keys) == 1 and all_distinct(data.column(keys[0])):
        return data  # the common case: no key repeats, nothing to drop
    indexed = data.append_column("_seq", pa.array(np.arange(data.num_rows, dtype=np.int64)))
    last = indexed.group_by(list(keys), use_threads=False).aggregate([("_seq", "max")])
    order = pc.sort_indices(last.column("_seq_max"))
    return data.take(pc.take(last.column("_seq_max"), order))


def apply_changes(base: pa.Table, changes: pa.Table, keys: Sequence[str]) -> pa.Table:
    """The state after ``changes`` on top of ``base``, with the stored columns (``_op`` kept).

    Args:
        base: one row per key, no tombstones (a compacted base, or an earlier result).
        changes: change rows, oldest epoch first; one row per key within an epoch.
        keys: the key columns.

    Returns:
        One row per live key: the base rows whose key no change touched, then the
        newest upsert of every key whose newest change is an upsert. Cost: one
        membership test over the base, and a group-by over the changes only.
    """
    if changes.num_rows == 0:
        return base
    changes = changes.select(base.column_names)
    epochs = pc.min_max(changes.column(EPOCH_COLUMN))
    # One epoch holds one row per key (its net change): with every row of the
    # same epoch there is nothing to group, and the group-by (the costliest step
    # of a snapshot when the store is one big epoch) is skipped.
    single_epoch = epochs["min"].as_py() == epochs["max"].as_py()
    net = changes if single_epoch else last_per_key(changes, keys)
    if base.num_rows:
        base = base.filter(pc.invert(member_mask(base, net, keys)))
    upserts = net if _no_tombstone(net) else net.filter(pc.equal(net.column(OP_COLUMN), "upsert"))
    if not upserts.schema.equals(base.schema):
        # Parts written at different times may spell one column's type two ways
        # (string and large_string, as Delta reads them back): one table, one spelling.
        upserts = upserts.cast(base.schema)
    return pa.concat_tables([base, upserts])


def _no_tombstone(rows: pa.Table) -> bool:
    """Whether ``rows`` surely hold no tombstone, seen without comparing every ``_op``.

    A tombstone's ``_row_hash`` is NULL and an upsert's never is (``change_rows``):
    a hash column without a NULL holds none. Without the column, nothing is known.
    """
    if ROW_HASH_COLUMN not in rows.column_names:
        return False
    return bool(rows.column(ROW_HASH_COLUMN).null_count == 0)


def resolve(rows: pa.Table, keys: Sequence[str]) -> pa.Table:
    """The state held by any set of rows of a store table, in any order.

    This is the helper for readers that are not the store (a plain Delta read
    through deltalake, Polars or DuckDB, converted to Arrow): pass every row of
    the table version and the key columns.

    Args:
        rows: rows with the key columns, ``_epoch`` and ``_op``.
        keys: the key columns.

    Returns:
        One row per live key (the row of its newest epoch), without ``_op``.
    """
    order = pc.sort_indices(rows, sort_keys=[(EPOCH_COLUMN, "ascending")])
    newest = last_per_key(rows.take(order), keys)
    live = newest.filter(pc.equal(newest.column(OP_COLUMN), "upsert"))
    return live.drop_columns([OP_COLUMN])
