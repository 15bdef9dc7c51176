"""The mutation check's joint baseline selects what pytest selects, and fails what did not pass.

The joint run replaces one baseline run per kill set, so its selection must be
pytest's own for every form a kill set takes (a file with ``-k``, a node id,
parametrized ids, a marker), and a kill set must fail its baseline when any of
its tests did not pass, or when it selects none.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import mutation_baseline
from tests.mutation_baseline import Selection, parse
from tests.mutation_runs import baseline_problems

REPO = Path(__file__).resolve().parents[2]

# Kill sets of the forms the mutants use, over tests that collect in a second.
KILL_SETS: list[tuple[list[str], str]] = [
    (["tests/unit/test_driver.py", "-k", "rejection or rejected"], ""),
    (["tests/unit/test_decimals.py::test_values_that_would_lose_digits_are_refused"], ""),
    (["tests/unit/test_failures.py"], ""),
    (["tests/unit/test_mutation_baseline.py"], "integration"),
]


def test_kill_sets_parse_into_selections_or_run_alone() -> None:
    assert parse(["a.py", "-k", "x or y"], "") == Selection(("a.py",), "x or y", "")
    assert parse(["a.py", "-m", "spark"], "slow") == Selection(("a.py",), "", "(slow) and (spark)")
    assert parse(["a.py::t[1]", "b.py"], "") == Selection(("a.py::t[1]", "b.py"), "", "")
    # Anything else keeps a run of its own.
    assert parse(["a.py", "--count", "3"], "") is None
    assert parse(["a.py", "-k"], "") is None
    assert parse(["-k", "x"], "") is None


def _collected(args: list[str]) -> list[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         "-p", "no:xdist", *args],
        cwd=REPO, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return [line for line in proc.stdout.splitlines() if "::" in line]


@pytest.mark.integration
def test_the_joint_selection_is_pytests_own(tmp_path: Path) -> None:
    selections = [parse(kill, marker) for kill, marker in KILL_SETS]
    assert all(s is not None for s in selections)
    (tmp_path / "groups.json").write_text(
        json.dumps([s.as_json() for s in selections if s is not None])
    )
    subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         "-p", "no:xdist", "-p", "tests.mutation_baseline",
         *mutation_baseline.root_paths(s for s in selections if s is not None)],
        cwd=REPO, capture_output=True, text=True, check=True,
        env={**os.environ, mutation_baseline.ENV: str(tmp_path)},
    )  # fmt: skip
    chosen = json.loads((tmp_path / "selection-main.json").read_text())
    for (kill, marker), selected in zip(KILL_SETS, chosen, strict=True):
        expected = _collected([*kill, *(["-m", marker] if marker else [])])
        assert sorted(selected) == sorted(expected), kill
        assert selected  # each form selects something here
    # The -k set is a proper part of its file; the marker set, of this one.
    assert len(chosen[0]) < len(_collected(["tests/unit/test_driver.py"]))
    assert chosen[3] == [f"tests/unit/test_mutation_baseline.py::{_THIS}"]


_THIS = "test_the_joint_selection_is_pytests_own"


def test_a_kill_set_fails_its_baseline_if_a_test_did_not_pass_or_none_is_selected() -> None:
    keys = [(("a.py",), ""), (("b.py",), ""), (("c.py",), "slow"), (("d.py",), "")]
    chosen = [["a.py::t1", "a.py::t2"], ["b.py::t"], [], ["d.py::t", "d.py::u"]]
    outcomes = {
        "a.py::t1": "passed",
        "a.py::t2": "skipped",
        "b.py::t": "failed",
        "d.py::t": "passed",
    }
    problems = baseline_problems(keys, chosen, outcomes)
    assert len(problems) == 3
    assert "b.py::t did not pass" in problems[0]
    assert "selects no test" in problems[1] and "'slow'" in problems[1]
    # d.py::u has no outcome: the run ended before it, so it did not pass.
    assert "d.py::u did not pass" in problems[2]
    assert baseline_problems(keys[:1], chosen[:1], outcomes) == []


def test_a_test_that_failed_in_any_recording_run_failed(tmp_path: Path) -> None:
    """Outcomes from several runs merge; one failure outweighs a pass elsewhere, in any order."""
    runs = {
        "a": {"t.py::x": "passed", "t.py::y": "failed", "t.py::z": "passed"},
        "b": {"t.py::x": "failed", "t.py::y": "passed", "t.py::w": "skipped"},
    }
    for name, outcomes in runs.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "outcomes.json").write_text(json.dumps(outcomes))
    (tmp_path / "c").mkdir()  # a run that ended without writing outcomes
    for order in (["a", "b", "c"], ["c", "b", "a"]):
        merged = mutation_baseline.recorded(tmp_path / n for n in order)
        assert merged == {
            "t.py::x": "failed",
            "t.py::y": "failed",
            "t.py::z": "passed",
            "t.py::w": "skipped",
        }
