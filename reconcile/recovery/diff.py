"""The pure diff: expected state against a sink's rows, by key and row hash.

No I/O: both sides arrive as Arrow tables of the key columns and ``_row_hash``
(the canonical row hash of the value columns, see ``reconcile.core.hashing``). The
result says which keys the sink lacks (missing), holds but should not (extra),
and holds with other values (changed).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
import pyarrow.compute as pc  # type: ignore[import-untyped, unused-ignore]

from reconcile.core.contract import InvalidInputError

__all__ = ["HASH", "Diff", "diff_tables"]

HASH = "_row_hash"
_EXPECTED, _ACTUAL = "_hash_expected", "_hash_actual"


@dataclass(frozen=True)
class Diff:
    """What differs, as key tables (the key columns only, in the expected types).

    ``extra`` also holds every repeat of a key the sink holds more than once
    (a sink table without a unique key): all but one copy must go.
    """

    missing: pa.Table
    extra: pa.Table
    changed: pa.Table

    @property
    def counts(self) -> dict[str, int]:
        return {
            "missing": self.missing.num_rows,
            "extra": self.extra.num_rows,
            "changed": self.changed.num_rows,
        }

    @property
    def empty(self) -> bool:
        return not (self.missing.num_rows or self.extra.num_rows or self.changed.num_rows)


def _side(table: pa.Table, keys: Sequence[str], hash_name: str, what: str) -> pa.Table:
    missing = [c for c in (*keys, HASH) if c not in table.column_names]
    if missing:
        raise InvalidInputError(
            f"diff: the {what} side lacks column {missing[0]!r} (has {table.column_names})",
            column=missing[0],
        )
    side = table.select([*keys, HASH]).rename_columns([*keys, hash_name])
    if side.column(hash_name).null_count:
        raise InvalidInputError(f"diff: the {what} side has a NULL {HASH}")
    for key in keys:
        if side.column(key).null_count:
            raise InvalidInputError(
                f"diff: the {what} side has a NULL in key column {key!r}", column=key
            )
    return side


def _conform_keys(actual: pa.Table, expected: pa.Table, keys: Sequence[str]) -> pa.Table:
    """Cast the sink's key columns to the expected state's types (naming any that cannot)."""
    for key in keys:
        want = expected.schema.field(key).type
        have = actual.schema.field(key).type
        if have.equals(want):
            continue
        try:
            column = actual.column(key).cast(want, safe=True)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise InvalidInputError(
                f"diff: key column {key!r} is {have} in the sink and {want} in the expected "
                f"state, and does not convert ({exc})",
                column=key,
            ) from exc
        actual = actual.set_column(actual.schema.get_field_index(key), key, column)
    return actual


def _repeats(actual: pa.Table, keys: Sequence[str]) -> tuple[pa.Table, pa.Table]:
    """(one row per key, the surplus copies of keys held more than once)."""
    counts = actual.group_by(list(keys)).aggregate([([], "count_all")])
    dup = counts.filter(pc.greater(counts.column("count_all"), 1))
    if dup.num_rows == 0:
        return actual, actual.select(list(keys)).slice(0, 0)
    surplus = [row for row in dup.to_pylist() for _ in range(int(row["count_all"]) - 1)]
    extra = pa.Table.from_pylist(
        [{k: r[k] for k in keys} for r in surplus], schema=actual.select(list(keys)).schema
    )
    # Keep one (arbitrary) copy of each key for the hash comparison; any copy
    # that differs from the expected row makes the key "changed" anyway.
    first = actual.group_by(list(keys)).aggregate([(_ACTUAL, "min")])
    return first.rename_columns([*keys, _ACTUAL]), extra


def diff_tables(expected: pa.Table, actual: pa.Table, keys: Sequence[str]) -> Diff:
    """Diff the expected state against the sink's rows.

    Args:
        expected: the expected state's key columns and ``_row_hash``.
        actual: the sink's key columns and ``_row_hash`` (computed the same way).
        keys: the key columns; unique in ``expected``.

    Returns:
        The missing, extra and changed keys.

    Raises:
        InvalidInputError: a side lacks a column, holds a NULL key or hash, or a
            key column does not convert to the expected type.
    """
    if not keys:
        raise InvalidInputError("diff: at least one key column is needed")
    e = _side(expected, keys, _EXPECTED, "expected")
    a = _conform_keys(_side(actual, keys, _ACTUAL, "sink"), e, keys)
    a, repeats = _repeats(a, keys)
    joined = e.join(a, keys=list(keys), join_type="full outer", coalesce_keys=True)
    in_expected = pc.is_valid(joined.column(_EXPECTED))
    in_actual = pc.is_valid(joined.column(_ACTUAL))
    both = pc.and_(in_expected, in_actual)
    differs = pc.and_(both, pc.not_equal(joined.column(_EXPECTED), joined.column(_ACTUAL)))
    key_cols = list(keys)
    extra = joined.filter(pc.invert(in_expected)).select(key_cols)
    if repeats.num_rows:
        extra = pa.concat_tables([extra, repeats.cast(extra.schema)])
    return Diff(
        missing=joined.filter(pc.invert(in_actual)).select(key_cols),
        extra=extra,
        changed=joined.filter(differs).select(key_cols),
    )
