"""The plan of a rebuild: how the new logic's expected state differs from the old one's.

The plan is taken from the two expected states, never from the sink: it says what the
logic change does, so a sink that drifted on its own does not inflate or hide it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
import pyarrow.compute as pc  # type: ignore[import-untyped, unused-ignore]

from expected_state.rebasing import Rebase
from reconcile.core.contract import InvalidInputError
from reconcile.core.hashing import row_hash_arrow
from reconcile.core.keys import all_distinct
from reconcile.recovery import diff_tables

_HASH = "_row_hash"


@dataclass(frozen=True)
class TablePlan:
    """Rows a rebuild would insert, update and delete in one sink table, with a sample of keys."""

    table: str
    inserts: int
    updates: int
    deletes: int
    sample: dict[str, list[dict[str, Any]]]

    @property
    def changed(self) -> int:
        """Every row the rebuild writes: inserted, updated or deleted."""
        return self.inserts + self.updates + self.deletes


def _hashed(rows: pa.Table, keys: Sequence[str], what: str, table: str) -> pa.Table:
    missing = [k for k in keys if k not in rows.schema.names]
    if missing:
        raise InvalidInputError(f"rebuild of {table}: the {what} state lacks key columns {missing}")
    values = sorted(c for c in rows.schema.names if c != _HASH)
    # The hash covers every column, keys included, in one fixed order: the old and the
    # new logic may emit the same columns in another order and mean the same rows.
    hashed = row_hash_arrow(rows, values) if rows.num_rows else pa.array([], pa.int64())
    return rows.select(list(keys)).append_column(_HASH, hashed)


def check_unique(rows: pa.Table, keys: Sequence[str], table: str) -> None:
    """Refuse new logic that gives a key twice: a sink table holds one row per key."""
    if not rows.num_rows or any(k not in rows.schema.names for k in keys):
        return  # a missing key column is named where the columns are checked
    if len(keys) == 1 and all_distinct(rows.column(keys[0])):
        return  # the usual case, without a group-by of every row
    counts = rows.group_by(list(keys)).aggregate([([], "count_all")])
    repeated = counts.filter(pc.greater(counts.column("count_all"), 1))
    if repeated.num_rows:
        first = repeated.slice(0, 1).select(list(keys)).to_pylist()[0]
        raise InvalidInputError(
            f"rebuild of {table}: the new logic gives {repeated.num_rows} keys more than once "
            f"(the first: {first}); a sink table holds one row per key; nothing was written",
            table=table,
        )


def plan_table(
    table: str, old: pa.Table, new: pa.Table, keys: Sequence[str], sample: int = 5
) -> TablePlan:
    """Diff the old logic's expected state against the new logic's, by key.

    Args:
        table: the sink table's name, for the plan and its errors.
        old: the expected state under the logic in force.
        new: the expected state under the new logic, with the same key columns.
        keys: the key columns; unique in ``new``.
        sample: how many keys of each kind to keep.

    Returns:
        The counts of inserts (in new only), updates (in both, differing) and deletes
        (in old only), and a sample of each.

    Raises:
        InvalidInputError: a side lacks a key column, or holds a NULL key; the new
            state holds a key twice.
    """
    check_unique(new, keys, table)
    diff = diff_tables(_hashed(new, keys, "new", table), _hashed(old, keys, "old", table), keys)
    return _plan(table, (diff.missing, diff.changed, diff.extra), sample)


def _plan(table: str, kinds: tuple[pa.Table, pa.Table, pa.Table], sample: int) -> TablePlan:
    """The plan of the keys inserted, updated and deleted, with the first few of each."""
    inserted, updated, deleted = kinds
    return TablePlan(
        table=table,
        inserts=inserted.num_rows,
        updates=updated.num_rows,
        deletes=deleted.num_rows,
        sample={
            "insert": inserted.slice(0, sample).to_pylist(),
            "update": updated.slice(0, sample).to_pylist(),
            "delete": deleted.slice(0, sample).to_pylist(),
        },
    )


def plan_of(table: str, rebase: Rebase, sample: int = 5) -> TablePlan:
    """The plan of a store table's rebase (``prepare_rebase``): its counts and a sample of keys.

    The rebuild plans from the rebase itself, with the store's own row hash, so
    that its plan and its writes are one computation.
    """
    return _plan(table, (rebase.inserted, rebase.changed, rebase.deletes), sample)
