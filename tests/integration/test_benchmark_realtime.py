"""Smoke test of the Real-Time Mode benchmark: ``python -m benchmarks.realtime --quick`` runs.

A real broker, a real PostgreSQL server and a Spark driver per mode, in a subprocess
as a user runs it: the report, its Markdown and its plot are written; every mode
delivered rows whose latencies were measured; the exactly-once modes wrote no
duplicate and missed no record (counted by SQL over the table); the targets follow
from the figures.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.realtime.report import P99_MS_TARGET, P99_RATIO_TARGET, ROWS_TARGET

pytestmark = [pytest.mark.slow, pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
EXACTLY_ONCE = ("rtm_exactly_once", "microbatch_pull_and_diff", "two_phase_")


# Four Spark drivers one after another: several minutes on 2 shared cores.
@pytest.mark.timeout(1800)
@pytest.mark.spark  # in a subprocess
def test_quick_run_measures_the_four_modes_and_the_exactly_once_ones_write_each_record_once(
    tmp_path: Path,
) -> None:
    out = tmp_path / "results"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYSPARK_PYTHON": sys.executable}
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.realtime", "--quick", "--out", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1700,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((out / "realtime.json").read_text())
    text = (out / "realtime.md").read_text()
    assert (out / "realtime_cdf.png").stat().st_size > 0
    assert report["quick"] is True and "QUICK RUN" in text

    modes = report["modes"]
    kinds = {x["kind"] for x in modes.values()}
    assert kinds == {"rtm_at_least_once", "rtm_exactly_once", "microbatch", "two_phase"}
    assert {"rtm_at_least_once", "rtm_exactly_once", "microbatch_pull_and_diff"} <= set(modes)
    assert any(m.startswith("two_phase_") for m in modes)
    for mode, x in modes.items():
        assert "error" not in x and "driver_error" not in x, (mode, x)
        assert x["measured_visible"] == x["measured_records"] > 0, (mode, x)
        assert x["rows_per_s"] > 0, (mode, x)
        assert x["producer"]["achieved_rate_per_s"] > 0, (mode, x)
        cdf = x["cdf_quantiles_ms"]
        assert len(cdf) == 101 and cdf == sorted(cdf), (mode, cdf)
        # Each record became visible after it was produced, within the run.
        assert 0 < cdf[0] <= x["p50_ms"] <= x["p90_ms"] <= x["p99_ms"] <= x["max_ms"] < 600_000
        assert x["missing"] == 0, (mode, x)
        if mode.startswith(EXACTLY_ONCE):
            assert x["duplicates"] == 0 and x["rows"] == x["expected_rows"], (mode, x)

    # The targets follow from the figures, and the Markdown says so.
    base = modes["rtm_at_least_once"]
    t = report["targets"]["rtm_exactly_once"]
    eo = modes["rtm_exactly_once"]
    assert t["p99_ms_met"] == (eo["p99_ms"] <= P99_MS_TARGET)
    assert t["p99_ratio"] == round(eo["p99_ms"] / base["p99_ms"], 3)
    assert t["p99_ratio_met"] == (t["p99_ratio"] <= P99_RATIO_TARGET)
    assert t["rows_per_s_ratio"] == round(eo["rows_per_s"] / base["rows_per_s"], 3)
    assert t["rows_per_s_met"] == (t["rows_per_s_ratio"] >= ROWS_TARGET)
    assert f"{t['p99_ratio']:.3f}x" in text and f"{t['rows_per_s_ratio']:.3f}x" in text
