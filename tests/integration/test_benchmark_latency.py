"""Smoke test of the latency benchmark: every mode runs, killed and restarted, at a tiny size.

``benchmarks.latency`` at 3 files (one trigger interval, one two-phase
checkpoint interval), with its crash runs, into a temporary folder: the
report has the keys the results rely on, the plot is written, and the
exactly-once modes (two-phase, pull-and-diff) lost and duplicated nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.latency import bench as latency

pytestmark = [pytest.mark.slow, pytest.mark.integration]

MODES = ("at_least_once", "two_phase_1s", "pull_and_diff")


# Four minutes alone on 2 cores (a Spark pipeline per mode, then each killed and run
# again); beside the other slow tests, more than the default limit of 300 s.
@pytest.mark.timeout(1500)
@pytest.mark.spark  # in a subprocess
def test_latency_benchmark_tiny(tmp_path: Path) -> None:
    out = tmp_path / "results"
    status = latency.main(
        ["--epochs", "3", "--crash-epochs", "8", "--triggers", "1", "--checkpoints", "1",
         "--out", str(out), "--workdir", str(tmp_path)]
    )  # fmt: skip
    assert status == 0
    report = json.loads((out / "latency.json").read_text())
    assert (out / "latency.md").exists()
    assert (out / "latency_cdf.png").stat().st_size > 0
    for key in ("machine", "versions", "scale", "epochs", "trigger_intervals_s", "by_trigger"):
        assert key in report, key
    assert report["trigger_intervals_s"] == [1.0]
    assert set(report["modes"]) == set(MODES)
    for name, figures in report["modes"].items():
        for key in ("p50_ms", "p95_ms", "p99_ms", "rows_per_s", "duplicates", "missing"):
            assert figures[key] is not None, (name, key)
        if name != "at_least_once":
            assert figures["duplicates"] == 0, (name, figures)
            assert figures["missing"] == 0, (name, figures)
    for name in MODES:
        crash = report["crash_runs"][name]
        assert "error" not in crash, crash
        # Every run ends with every line in the table (the at-least-once mode may
        # count some twice in the totals, never lose one).
        assert crash["lineitem_missing"] == 0, crash
        assert crash["crashes"], crash  # the kills fired
        # Each restart's steps, logged by the process itself: the same for every
        # mode. Its first own batch is visible only once its Spark is up (two-phase's
        # checkpoint of what the killed process prepared settles; it does not resume).
        assert len(crash["restart_steps"]) == len(crash["settled_s"]) == len(crash["resumed_s"])
        assert any(steps["resumed_s"] is not None for steps in crash["restart_steps"]), crash
        for steps in crash["restart_steps"]:
            up, resumed = steps["spark_up_s"], steps["resumed_s"]
            if resumed is not None:
                assert up is not None and steps["process_s"] <= up <= resumed, (name, steps)
            # Only the exactly-once modes have what the killed process left to settle.
            assert (steps["settled_s"] is None) == (name == "at_least_once"), (name, steps)
    assert report["targets"]["exactly_once_zero_duplicates_missing"]["pass"]
    # The report counts the kills from the run's data, and is not a quick run.
    text = (out / "latency.md").read_text()
    fired = ", ".join(f"{n} {len(report['crash_runs'][n]['crashes'])}" for n in MODES)
    assert f"Kills that fired: {fired} " in text and "twice," not in text
    assert report["quick"] is False and "A quick run" not in text
    # The CDF is kept in the JSON, and the plot is redrawn from it alone.
    cdf = report["cdf_quantiles_ms"]["1"]
    assert set(cdf) == set(MODES) and all(len(v) == 201 and v == sorted(v) for v in cdf.values())
    (out / "latency_cdf.png").unlink()
    assert latency.main(["--plot-only", "--out", str(out)]) == 0
    assert (out / "latency_cdf.png").stat().st_size > 0
