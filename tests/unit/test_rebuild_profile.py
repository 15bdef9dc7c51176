"""The rebuild benchmark's profile summary: shares of py-spy's raw stacks, by function."""

from __future__ import annotations

from pathlib import Path

from benchmarks.rebuild.profile import summary

OUTER = "_run_code (<frozen runpy>:88);main (benchmarks/rebuild/bench.py:3);"
RAW = (
    f"{OUTER}rebuild (reconcile/rebuild/run.py:203);diff_tables (reconcile/recovery/diff.py:1) 3\n"
    f"{OUTER}rebuild (reconcile/rebuild/run.py:210);commit_files (store/delta_commit.py:9) 1\n"
)


def test_shares_count_each_function_once_per_stack_without_the_benchmarks_frames(
    tmp_path: Path,
) -> None:
    raw = tmp_path / "raw.txt"
    raw.write_text(RAW)
    found = summary(raw)
    assert found["samples"] == 4
    assert found["inclusive"] == [
        ["rebuild (run.py)", 1.0], ["diff_tables (diff.py)", 0.75],
        ["commit_files (delta_commit.py)", 0.25],
    ]  # fmt: skip
    assert found["self"] == [
        ["diff_tables (diff.py)", 0.75],
        ["commit_files (delta_commit.py)", 0.25],
    ]


def test_an_empty_profile_has_no_shares(tmp_path: Path) -> None:
    raw = tmp_path / "raw.txt"
    raw.write_text("")
    assert summary(raw) == {"samples": 0, "rate_hz": 50, "inclusive": [], "self": []}
