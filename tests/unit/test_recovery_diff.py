"""The pure diff and the auto mode decision, with no database."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reconcile.core.contract import InvalidInputError
from reconcile.recovery import Mode, choose_mode, diff_tables


def side(rows: dict[tuple[int, str], int]) -> pa.Table:
    return pa.table(
        {
            "a": pa.array([k[0] for k in rows], pa.int64()),
            "b": pa.array([k[1] for k in rows], pa.string()),
            "_row_hash": pa.array(list(rows.values()), pa.int64()),
        }
    )


def keys_of(table: pa.Table) -> list[tuple[int, str]]:
    return sorted(zip(table.column("a").to_pylist(), table.column("b").to_pylist(), strict=True))


def test_missing_extra_and_changed_by_composite_key() -> None:
    expected = side({(1, "x"): 10, (2, "x"): 20, (3, "y"): 30})
    actual = side({(1, "x"): 10, (2, "x"): 21, (4, "z"): 40})
    diff = diff_tables(expected, actual, ["a", "b"])
    assert keys_of(diff.missing) == [(3, "y")]
    assert keys_of(diff.extra) == [(4, "z")]
    assert keys_of(diff.changed) == [(2, "x")]
    assert diff.counts == {"missing": 1, "extra": 1, "changed": 1}


def test_equal_sides_and_empty_sides() -> None:
    same = side({(1, "x"): 10})
    assert diff_tables(same, same, ["a", "b"]).empty
    empty = side({})
    assert diff_tables(same, empty, ["a", "b"]).counts == {"missing": 1, "extra": 0, "changed": 0}
    assert diff_tables(empty, same, ["a", "b"]).counts == {"missing": 0, "extra": 1, "changed": 0}


def test_repeated_sink_keys_are_extra_and_key_types_are_aligned() -> None:
    expected = side({(1, "x"): 10})
    actual = pa.table(
        {
            "a": pa.array([1, 1, 1], pa.int32()),  # another integer width: cast
            "b": ["x", "x", "x"],
            "_row_hash": pa.array([10, 10, 10], pa.int64()),
        }
    )
    diff = diff_tables(expected, actual, ["a", "b"])
    assert diff.counts == {"missing": 0, "extra": 2, "changed": 0}


def test_a_key_held_exactly_twice_is_one_extra_row() -> None:
    """The edge of "more than once": two copies, beside keys held once, each surplus once."""
    expected = side({(1, "x"): 10, (2, "x"): 20, (3, "y"): 30})
    actual = pa.table(
        {
            "a": pa.array([1, 2, 2, 3, 3, 3], pa.int64()),
            "b": ["x", "x", "x", "y", "y", "y"],
            "_row_hash": pa.array([10, 20, 20, 30, 30, 30], pa.int64()),
        }
    )
    diff = diff_tables(expected, actual, ["a", "b"])
    assert keys_of(diff.extra) == [(2, "x"), (3, "y"), (3, "y")]
    assert diff.counts == {"missing": 0, "extra": 3, "changed": 0}
    # Two copies of a key the store does not have: both are extra.
    stray = pa.concat_tables([actual, side({(9, "z"): 90}), side({(9, "z"): 90})])
    assert keys_of(diff_tables(expected, stray, ["a", "b"]).extra) == [
        (2, "x"), (3, "y"), (3, "y"), (9, "z"), (9, "z")]  # fmt: skip


def test_bad_sides_are_named() -> None:
    with pytest.raises(InvalidInputError, match="sink side lacks column '_row_hash'"):
        diff_tables(side({}), pa.table({"a": [1], "b": ["x"]}), ["a", "b"])
    bad = pa.table({"a": ["one"], "b": ["x"], "_row_hash": pa.array([1], pa.int64())})
    with pytest.raises(InvalidInputError, match="key column 'a' is string in the sink"):
        diff_tables(side({}), bad, ["a", "b"])


rows = st.dictionaries(
    st.tuples(st.integers(0, 20), st.sampled_from(["x", "y"])), st.integers(0, 3), max_size=30
)


@settings(max_examples=200, deadline=None)
@given(expected=rows, actual=rows)
def test_diff_matches_a_set_model(
    expected: dict[tuple[int, str], int], actual: dict[tuple[int, str], int]
) -> None:
    diff = diff_tables(side(expected), side(actual), ["a", "b"])
    assert keys_of(diff.missing) == sorted(expected.keys() - actual.keys())
    assert keys_of(diff.extra) == sorted(actual.keys() - expected.keys())
    both = expected.keys() & actual.keys()
    assert keys_of(diff.changed) == sorted(k for k in both if expected[k] != actual[k])


def test_auto_mode_decision() -> None:
    crash = dict(after_crash=True, epoch_column=True, bucket_checksums=True, verified_epoch=4)
    assert choose_mode(Mode.AUTO, **crash)[0] is Mode.SCOPED  # type: ignore[arg-type]
    check = {**crash, "after_crash": False}
    mode, reason = choose_mode(Mode.AUTO, **check)  # type: ignore[arg-type]
    assert mode is Mode.BUCKETS and "no bucket summary is kept yet" in reason, reason
    mode, reason = choose_mode(Mode.AUTO, **check, summary_kept=True)  # type: ignore[arg-type]
    assert mode is Mode.BUCKETS and "a kept summary stands for the expected side" in reason
    bare = dict(after_crash=True, epoch_column=False, bucket_checksums=False, verified_epoch=None)
    mode, reason = choose_mode(Mode.AUTO, **bare)  # type: ignore[arg-type]
    assert mode is Mode.FULL and "no bucket checksums" in reason
    assert choose_mode(Mode.FULL, **crash) == (Mode.FULL, "requested")  # type: ignore[arg-type]
