"""Which change files one merge takes: consecutive, small, of like sizes, at most ``max_rows``."""

from __future__ import annotations

from expected_state.compaction import merge_groups
from expected_state.layout import StoreFile


def change(epoch: int, rows: int | None, first: int | None = None) -> StoreFile:
    start = epoch if first is None else first
    return StoreFile(f"t/{start}-{epoch}", f"{start}-{epoch}", "change", epoch, 100, start, rows)


def epochs(runs: list[list[StoreFile]]) -> list[list[int]]:
    return [[f.epoch for f in run] for run in runs]


def test_small_files_merge_newest_first_in_runs_of_at_most_max_rows() -> None:
    files = [change(e, 3) for e in range(1, 8)]
    # 3 + 3 + 3 = 9 <= 10, a fourth would make 12: runs of three from the newest,
    # and the oldest is left alone.
    assert epochs(merge_groups(files, 10)) == [[2, 3, 4], [5, 6, 7]]
    # Exactly max_rows is allowed in one run.
    assert epochs(merge_groups([change(1, 4), change(2, 4), change(3, 4)], 12)) == [[1, 2, 3]]
    # The order of the list does not matter, the epochs do.
    assert epochs(merge_groups(list(reversed(files)), 10)) == [[2, 3, 4], [5, 6, 7]]


def test_a_large_file_is_left_alone_and_no_run_spans_it() -> None:
    # Half of max_rows is large: it would be merged into a run no smaller than itself.
    files = [change(1, 1), change(2, 1), change(3, 5), change(4, 1), change(5, 1), change(6, 1)]
    assert epochs(merge_groups(files, 10)) == [[1, 2], [4, 5, 6]]
    # 5 < 12 // 2: small, and it joins the older small files, not the newer ones
    # (1 + 1 + 1 < 5: they do not add up to it yet).
    assert epochs(merge_groups(files, 12)) == [[1, 2, 3], [4, 5, 6]]
    # A file whose row count the log lacks is treated as large: its size is unknown.
    assert epochs(merge_groups([change(1, 1), change(2, None), change(3, 1)], 10)) == []


def test_a_merged_file_takes_part_by_its_rows_and_runs_of_one_are_not_merges() -> None:
    files = [change(10, 2, first=1), change(11, 1), change(12, 1), change(13, 4), change(14, 1)]
    # 1 + 1 add up to the merged file's 2; then 4 is large (>= 8 // 2).
    assert epochs(merge_groups(files, 8)) == [[10, 11, 12]]
    assert merge_groups([change(1, 1)], 10) == [] and merge_groups([], 10) == []


def test_an_older_bigger_file_waits_until_newer_ones_add_up_to_it() -> None:
    files = [change(4, 8, first=1), change(5, 2), change(6, 2), change(7, 4)]
    # 4 + 2 + 2 = 8: the merged file of epochs 1-4 joins only now.
    assert epochs(merge_groups(files, 100)) == [[4, 5, 6, 7]]
    assert epochs(merge_groups(files[:-1], 100)) == [[5, 6]]  # 2 + 2 < 8: it waits


def simulate(rows_of_epochs: list[int], every: int, max_rows: int) -> tuple[float, int]:
    """Epochs appended, a merge of all but the newest every ``every`` epochs, as maintain() does.

    Returns:
        The rows the merges wrote per row the epochs wrote, and the most live files.
    """
    files: list[StoreFile] = []
    written = most = 0
    for epoch, rows in enumerate(rows_of_epochs):
        files.append(change(epoch, rows))
        if (epoch + 1) % every:
            continue
        for run in merge_groups(files[:-1], max_rows):
            merged = change(run[-1].epoch, sum(f.rows or 0 for f in run), first=run[0].first)
            at = files.index(run[0])
            files[at : at + len(run)] = [merged]
            written += merged.rows or 0
        most = max(most, len(files))
    return written / sum(rows_of_epochs), most


def test_a_row_is_merged_a_few_times_not_once_per_merge() -> None:
    # 100 rows an epoch, a merge every 50 epochs (maintain's default), runs of up
    # to 1M rows: packing every small file into one growing run rewrote that run at
    # each merge, so a row was merged about 100 times before its file was large.
    amplification, most = simulate([100] * 40_000, 50, 1_000_000)
    assert amplification <= 8, amplification
    assert most <= 64, most


def test_epochs_that_shrink_steadily_do_not_pile_up_files() -> None:
    # Each older file is bigger than all the newer ones together: no file joins a
    # newer run, and without the bound every epoch would stay a file of its own.
    amplification, most = simulate([100_000 - e for e in range(3_000)], 50, 10_000_000)
    assert most <= 64 + 50, most
    assert amplification <= 64, amplification
