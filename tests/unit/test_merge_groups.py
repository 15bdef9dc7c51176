"""Which change files one merge takes: consecutive small ones, at most ``max_rows`` a run."""

from __future__ import annotations

from expected_state.compaction import merge_groups
from expected_state.layout import StoreFile


def change(epoch: int, rows: int | None, first: int | None = None) -> StoreFile:
    start = epoch if first is None else first
    return StoreFile(f"t/{start}-{epoch}", f"{start}-{epoch}", "change", epoch, 100, start, rows)


def epochs(runs: list[list[StoreFile]]) -> list[list[int]]:
    return [[f.epoch for f in run] for run in runs]


def test_small_files_merge_oldest_first_in_runs_of_at_most_max_rows() -> None:
    files = [change(e, 3) for e in range(1, 8)]
    # 3 + 3 + 3 = 9 <= 10, a fourth would make 12: runs of three, and a last of one is left.
    assert epochs(merge_groups(files, 10)) == [[1, 2, 3], [4, 5, 6]]
    # Exactly max_rows is allowed in one run.
    assert epochs(merge_groups([change(1, 4), change(2, 4), change(3, 4)], 12)) == [[1, 2, 3]]
    # The order of the list does not matter, the epochs do.
    assert epochs(merge_groups(list(reversed(files)), 10)) == [[1, 2, 3], [4, 5, 6]]


def test_a_large_file_is_left_alone_and_no_run_spans_it() -> None:
    # Half of max_rows is large: it would be merged into a run no smaller than itself.
    files = [change(1, 1), change(2, 1), change(3, 5), change(4, 1), change(5, 1), change(6, 1)]
    assert epochs(merge_groups(files, 10)) == [[1, 2], [4, 5, 6]]
    assert epochs(merge_groups(files, 12)) == [[1, 2, 3, 4, 5, 6]]  # 5 < 12 // 2: small
    # A file whose row count the log lacks is treated as large: its size is unknown.
    assert epochs(merge_groups([change(1, 1), change(2, None), change(3, 1)], 10)) == []


def test_a_merged_file_takes_part_by_its_rows_and_runs_of_one_are_not_merges() -> None:
    files = [change(10, 2, first=1), change(11, 1), change(12, 4), change(13, 1)]
    assert epochs(merge_groups(files, 8)) == [[10, 11]]  # 2 + 1, then 4 is large (>= 8 // 2)
    assert merge_groups([change(1, 1)], 10) == [] and merge_groups([], 10) == []
