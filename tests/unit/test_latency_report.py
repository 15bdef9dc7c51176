"""The latency benchmark's report says what the run's data says: kills, quick runs, the plot."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks.latency.report import QUANTILES, QUICK_NOTE, cdf_quantiles, markdown, plot

COMMITTED = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "latency.json"


@pytest.fixture
def report() -> dict[str, Any]:
    found: dict[str, Any] = json.loads(COMMITTED.read_text())
    return found


def crash_section(text: str) -> str:
    return text.split("## Crash runs", 1)[1].split("## Method", 1)[0]


def test_the_crash_runs_count_the_kills_that_fired(report: dict[str, Any]) -> None:
    one_kill = copy.deepcopy(report)
    one_kill["crash_runs"]["two_phase_1s"]["crashes"] = ["bench.batch.written:6"]
    one_kill["crash_runs"]["two_phase_5s"]["crashes"] = []
    section = crash_section(markdown(one_kill))
    assert "twice" not in section
    assert "Kills that fired: at_least_once 2, two_phase_1s 1, two_phase_5s 0," in section
    assert "| two_phase_1s | 1: bench.batch.written:6 |" in section
    assert "| two_phase_5s | none |" in section
    assert "| at_least_once | 2: bench.batch.written:3, bench.batch.written:6 |" in section


def test_a_quick_run_says_so_at_the_top(report: dict[str, Any]) -> None:
    assert QUICK_NOTE not in markdown(report)  # the committed run is a full one
    quick = markdown({**report, "quick": True}).splitlines()
    assert quick[0].startswith("# Event-to-visible latency")
    assert quick[2] == QUICK_NOTE and quick[4].startswith("Run ")


def test_the_caption_names_the_panel_of_the_calibration_run_alone(
    report: dict[str, Any],
) -> None:
    text = markdown(report)
    assert "The 0.5 s panel holds one curve: the calibration run of at_least_once" in text
    assert "batch p95 535.0 ms >= the 500 ms interval" in text
    assert "The 0.75 s panel" not in text  # every mode ran at 0.75 s


def test_the_cdf_kept_in_the_json_runs_from_the_fastest_row_to_the_slowest() -> None:
    kept = cdf_quantiles({"1": {"a": [float(v) for v in range(1000, 0, -1)], "b": []}})
    a = kept["1"]["a"]
    assert len(a) == len(QUANTILES) == 201
    assert (a[0], a[100], a[-1]) == (1.0, 500.5, 1000.0)
    assert a == sorted(a) and kept["1"]["b"] == []


def test_the_plot_is_drawn_from_the_json_alone(report: dict[str, Any], tmp_path: Path) -> None:
    saved = {
        **report,
        "quick": True,
        "cdf_quantiles_ms": cdf_quantiles(
            {"0.5": {"at_least_once": [400.0, 900.0]},
             "1": {"at_least_once": [300.0, 700.0], "pull_and_diff": [310.0, 720.0]}}
        ),
    }  # fmt: skip
    plot(json.loads(json.dumps(saved)), tmp_path)
    assert (tmp_path / "latency_cdf.png").read_bytes().startswith(b"\x89PNG")
