"""The slow tier's list (tests/fix_tiers.py): what it marks, when it goes stale, how it samples."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

from tests.fix_tiers import (
    HEAVY,
    HEAVY_ROWS,
    SAMPLE_ENV,
    mark_spark_tests,
    marks_module_spark,
    parse_sample,
    sample,
    slow_tier,
    unmatched,
)
from tests.mutation import drawn, load_mutants

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
    assert slow_tier(f"{spark}[cycle.decided-write_stream]")  # the Kafka-fed one stays
    kafka = (
        "tests/integration/test_kafka_stream.py::"
        "test_kafka_to_postgres_and_kafka_exactly_once_with_the_driver_killed"
    )
    assert slow_tier(f"{kafka}[stream.batch_staged]")
    assert not slow_tier(f"{kafka}[cycle.decided]")


def test_a_pattern_that_matches_nothing_in_its_collected_file_is_stale() -> None:
    renamed = [
        f"{KILL9.replace('converges', 'settles')}[stage-delta]",
        f"{KILL9}[stage-file]",
        f"{KILL9}[finalize-file]",
        f"{KILL9}[stage-mariadb]",
        f"{KILL9}[stage-kafka]",
        # (the file's other slow patterns, matched: only the renamed one is stale)
        "tests/chaos/test_kill9.py::test_kill9_inside_the_iceberg_commit"
        "[iceberg-commit-checked-iceberg]",
        f"{KILL9}[stage-delta_spark]",
        "tests/chaos/test_kill9.py::test_kill9_inside_the_delta_spark_commit[delta_spark]",
    ]
    stale = unmatched(renamed, ["tests/chaos/test_kill9.py"])
    assert len(stale) == 1 and "test_kill9" in stale[0]
    assert unmatched(renamed, []) == stale  # no arguments: the test paths, all collected
    assert unmatched(renamed, ["tests/chaos"]) == stale
    # A run of other files, or of node ids, cannot tell.
    assert unmatched(renamed, ["tests/unit"]) == []
    assert unmatched(renamed, [f"{KILL9}[stage-file]"]) == []
    both = [f"{KILL9}[stage-delta]", *renamed[1:]]
    assert unmatched(both, ["tests/chaos/test_kill9.py"]) == []


def test_a_heavy_test_renamed_is_stale() -> None:
    ha = "tests/chaos/test_ha.py::test_kill_pause_kill_the_leader_nothing_lost_or_doubled"
    assert ha in HEAVY["the long end-to-end runs"][1]
    others = ["tests/chaos/test_ha.py::test_other", "tests/chaos/test_ha.py::test_more"]
    assert unmatched([*others, ha], ["tests/chaos/test_ha.py"]) == []
    stale = unmatched([*others, ha.replace("leader", "primary")], ["tests/chaos/test_ha.py"])
    assert stale == [re.escape(ha)]


def test_a_run_marks_them_slow_before_it_selects() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         "-p", "no:xdist", "-m", "slow", "tests/chaos/test_kill9.py"],
        cwd=REPO, capture_output=True, text=True, check=True,
        # Not CI's seeded sample (its draw would leave out some of each family).
        env={k: v for k, v in os.environ.items() if k != "RECONCILE_SLOW_SAMPLE"},
    )  # fmt: skip
    chosen = [line for line in proc.stdout.splitlines() if "::" in line]
    assert chosen and all(slow_tier(nodeid) for nodeid in chosen)
    assert {n.rsplit("[", 1)[1].rsplit("-", 1)[-1] for n in chosen} == {
        "postgres_prepared]", "delta]", "file]", "iceberg]", "mariadb]", "kafka]", "delta_spark]",
    }  # fmt: skip
    assert not any("[stage-file]" in n or "[prepare-done-file]" in n for n in chosen)


def _family(name: str, size: int) -> list[str]:
    return [f"tests/chaos/test_x.py::{name}[p{i}]" for i in range(size)]


def test_a_sample_draws_a_share_of_each_family_and_keeps_the_rest_whole() -> None:
    big, three, two = _family("test_big", 10), _family("test_three", 3), _family("test_two", 2)
    lone = ["tests/chaos/test_x.py::test_lone"]
    slow = big + three + two + lone
    left_out = sample(slow, "seed-1", 1 / 3, set())
    # ceil(10 / 3) = 4 of the ten and 1 of the three run; a pair and a lone test run whole.
    assert len([n for n in big if n not in left_out]) == 4
    assert len([n for n in three if n not in left_out]) == 1
    assert not set(left_out) & set(two + lone)
    # The same seed draws the same; another seed draws another sample of the big family.
    assert sample(list(reversed(slow)), "seed-1", 1 / 3, set()) == sorted(
        left_out, key=list(reversed(slow)).index
    )
    assert any(set(sample(slow, f"seed-{n}", 1 / 3, set())) != set(left_out) for n in range(2, 6))
    # A family's draw does not depend on the other families.
    assert [n for n in sample(big, "seed-1", 1 / 3, set())] == [n for n in left_out if n in big]


def test_a_sample_keeps_every_test_a_mutant_claims() -> None:
    big = _family("test_big", 9)
    left_out = sample(big, "s", 1 / 3, set())
    claimed = set(left_out[:2])
    kept = [n for n in big if n not in sample(big, "s", 1 / 3, claimed)]
    assert len(kept) == 3 + 2 and claimed <= set(kept)
    # A share of one runs the whole family.
    assert sample(big, "s", 1.0, set()) == []


def test_a_sample_value_is_a_seed_and_an_optional_share() -> None:
    assert parse_sample("abc") == ("abc", pytest.approx(1 / 3))
    assert parse_sample("abc:0.5") == ("abc", 0.5)
    for bad in ("", ":0.5", "abc:0", "abc:1.5", "abc:half"):
        with pytest.raises(pytest.UsageError, match="RECONCILE_SLOW_SAMPLE"):
            parse_sample(bad)


def test_a_sampled_run_says_how_to_repeat_it_and_keeps_the_claimed_tests() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         "-p", "no:xdist", "-m", "slow", "tests/chaos/test_kill9.py",
         "tests/integration/test_spark_stream.py"],
        cwd=REPO, capture_output=True, text=True, check=True,
        # Every mutant claims its tests here (CI's own mutant draw left out).
        env={**{k: v for k, v in os.environ.items() if k != "RECONCILE_MUTATION_SAMPLE"},
             SAMPLE_ENV: "draw-7"},
    )  # fmt: skip
    chosen = [line for line in proc.stdout.splitlines() if "::" in line]
    kill9 = [n for n in chosen if "test_kill9" in n]
    # A third of the 44 slow parameter sets, rounded up (15), the lone kill inside the
    # Iceberg commit (a family of one runs whole), and two of the delta-spark sink's
    # kills (HEAVY_ROWS: drawn apart from their families).
    assert len(kill9) == 16 + HEAVY_ROWS["the delta-spark sink's fault rows"][0]
    assert len([n for n in kill9 if "delta_spark" in n]) == 2
    # The one driver-killed test that a mutant's kill set (-k cycle.decided) selects.
    assert any("test_driver_killed" in n and "cycle.decided-auto" in n for n in chosen)
    assert f"({SAMPLE_ENV}=draw-7): " in proc.stdout


def test_a_sampled_run_that_draws_none_of_a_patterns_tests_is_not_stale() -> None:
    # This seed's draw of the kill family keeps none of the four file kills that one
    # pattern lists: the pattern still matches collected tests, so the run goes on.
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         "-p", "no:xdist", "-m", "slow", "tests/chaos/test_kill9.py"],
        cwd=REPO, capture_output=True, text=True, check=False,
        env={**os.environ, SAMPLE_ENV: "002ddraw"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    chosen = [line for line in proc.stdout.splitlines() if "::" in line]
    assert chosen and not any(n.endswith("-file]") for n in chosen)


class _Item:
    """What tests/fix_tiers.py reads of a collected test."""

    def __init__(self, nodeid: str, module: object, *fixtures: str) -> None:
        self.nodeid, self.module, self.fixturenames = nodeid, module, list(fixtures)
        self.marks: list[str] = []

    def add_marker(self, mark: pytest.MarkDecorator) -> None:
        self.marks.append(mark.name)


def test_the_tests_that_use_the_spark_session_are_marked_and_no_others() -> None:
    """A Spark module's test that needs no JVM stays in the non-Spark tier."""
    module = types.SimpleNamespace(pytestmark=[pytest.mark.integration])
    stream = _Item("t.py::test_stream", module, "spark", "pg_db")
    heartbeat = _Item("t.py::test_heartbeat", module, "pg_db")
    mark_spark_tests([stream, heartbeat])  # type: ignore[list-item]
    assert (stream.marks, heartbeat.marks) == (["spark"], [])


def test_a_spark_marker_on_a_whole_module_fails_the_run() -> None:
    whole = types.SimpleNamespace(pytestmark=pytest.mark.spark)  # a lone mark, not a list
    listed = types.SimpleNamespace(pytestmark=[pytest.mark.integration, pytest.mark.spark])
    assert marks_module_spark(whole) and marks_module_spark(listed)
    assert not marks_module_spark(types.SimpleNamespace()) and not marks_module_spark(None)
    with pytest.raises(pytest.UsageError, match=r"\['t\.py'\] mark `spark` on the whole module"):
        mark_spark_tests([_Item("t.py::test_x", listed)])  # type: ignore[list-item]


@pytest.mark.parametrize(("group", "keep"), [("the benchmarks' smoke runs", 1),
                                           ("the long end-to-end runs", 2)])  # fmt: skip
def test_a_sample_runs_a_few_of_a_heavy_group_besides_the_claimed(group: str, keep: int) -> None:
    assert HEAVY[group][0] == keep
    heavy = sorted(HEAVY[group][1])
    lone = ["tests/chaos/test_x.py::test_lone"]
    left_out = sample(heavy + lone, "seed-1", 1 / 3, set())
    assert len(left_out) == len(heavy) - keep and not set(left_out) & set(lone)
    assert len(sample(heavy[:2], "seed-1", 1 / 3, set())) == max(0, 2 - keep)  # at most all
    assert any(
        set(sample(heavy, f"seed-{n}", 1 / 3, set())) != set(left_out) for n in range(2, 8)
    )  # another seed draws another one: over commits, each runs
    assert sample(heavy, "seed-1", 1 / 3, set(heavy)) == []  # a claimed one always runs


def test_a_mutant_draw_is_per_mutant_and_repeatable() -> None:
    mutants = load_mutants()
    names = {m.name for m in drawn(mutants, "seed-1")}
    assert 0 < len(names) < len(mutants)
    assert abs(len(names) - len(mutants) / 3) < len(mutants) / 10  # a third, near enough
    assert {m.name for m in drawn(mutants, "seed-1")} == names  # the same value, the same draw
    assert {m.name for m in drawn(mutants[::2], "seed-1")} == names & {m.name for m in mutants[::2]}
    assert drawn(mutants, "") == mutants and drawn(mutants, "s:1") == mutants
    with pytest.raises(ValueError, match="RECONCILE_MUTATION_SAMPLE"):
        drawn(mutants, ":0.5")


def test_the_delta_spark_fault_rows_are_drawn_a_few_at_a_time_apart_from_their_families() -> None:
    rows = [
        "tests/chaos/test_failure_matrix.py::test_failure_matrix[delta_spark-begin-crash]",
        "tests/chaos/test_failure_matrix.py::test_failure_matrix[delta_spark-commit-definite-sink-fatal]",
        "tests/chaos/test_failure_matrix.py::test_zombie_writer_is_fenced[delta_spark]",
        "tests/chaos/test_kill9.py::test_kill9_then_restart_converges[stage-delta_spark]",
        "tests/chaos/test_kill9.py::test_kill9_then_restart_converges[finalize-delta_spark]",
        "tests/chaos/test_kill9.py::test_kill9_inside_the_delta_spark_commit[delta_spark]",
    ]
    others = [f"tests/chaos/test_kill9.py::test_kill9_then_restart_converges[stage-{k}]"
              for k in ("delta", "iceberg", "file")]  # fmt: skip
    keep = HEAVY_ROWS["the delta-spark sink's fault rows"][0]
    left_out = sample(rows + others, "seed-1", 1, set())  # the others' family runs whole
    assert len(left_out) == len(rows) - keep and set(left_out) <= set(rows)
    assert sample(rows, "seed-1", 1, set(rows)) == []  # a claimed one always runs
