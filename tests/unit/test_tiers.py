"""The slow tier's list (tests/fix_tiers.py) marks what it names, and fails when it goes stale."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.fix_tiers import slow_tier, unmatched

REPO = Path(__file__).resolve().parents[2]
KILL9 = "tests/chaos/test_kill9.py::test_kill9_then_restart_converges"


def test_the_listed_parameters_are_slow_and_their_neighbours_are_not() -> None:
    assert slow_tier(f"{KILL9}[stage-postgres_prepared]")
    assert slow_tier(f"{KILL9}[commit-first-sink-delta]")
    assert not slow_tier(f"{KILL9}[stage-postgres]")
    assert not slow_tier(f"{KILL9}[stage-file]")
    spark = (
        "tests/integration/test_spark_stream.py::test_driver_killed_mid_batch_resumes_exactly_once"
    )
    assert slow_tier(f"{spark}[cycle.decided-auto]")
    assert slow_tier(f"{spark}[stream.batch_staged-write_stream]")
    assert not slow_tier(f"{spark}[cycle.decided-write_stream]")


def test_a_pattern_that_matches_nothing_in_its_collected_file_is_stale() -> None:
    renamed = [f"{KILL9.replace('converges', 'settles')}[stage-delta]", f"{KILL9}[stage-file]"]
    stale = unmatched(renamed, ["tests/chaos/test_kill9.py"])
    assert len(stale) == 1 and "test_kill9" in stale[0]
    assert unmatched(renamed, []) == stale  # no arguments: the test paths, all collected
    assert unmatched(renamed, ["tests/chaos"]) == stale
    # A run of other files, or of node ids, cannot tell.
    assert unmatched(renamed, ["tests/unit"]) == []
    assert unmatched(renamed, [f"{KILL9}[stage-file]"]) == []
    assert unmatched([f"{KILL9}[stage-delta]"], ["tests/chaos/test_kill9.py"]) == []


def test_a_run_marks_them_slow_before_it_selects() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         "-p", "no:xdist", "-m", "slow", "tests/chaos/test_kill9.py"],
        cwd=REPO, capture_output=True, text=True, check=True,
    )  # fmt: skip
    chosen = [line for line in proc.stdout.splitlines() if "::" in line]
    assert chosen and all(slow_tier(nodeid) for nodeid in chosen)
    assert {n.rsplit("-", 1)[1] for n in chosen} == {"postgres_prepared]", "delta]"}
