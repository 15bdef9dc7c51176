"""Smoke test of the Kafka benchmark: ``python -m benchmarks.kafka --quick`` runs end to end.

A real broker, a real PostgreSQL server and one Spark driver (the quick run's
default) for the four runs: the report, its Markdown and its plot are written,
every figure is a measured one (latencies of every record, rows/s from commit
timestamps, the sink's rows counted back from the topic), and each target's
ratio and verdict follow from those figures.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.kafka import bench as kafka
from benchmarks.kafka.report import P99_TARGET, ROWS_TARGET

pytestmark = [pytest.mark.slow, pytest.mark.integration]

MODES = {"exactly_once", "at_least_once"}


# About a minute and a half alone on 2 cores (a broker, a server, one Spark driver);
# much more beside other work on the same cores.
@pytest.mark.timeout(1200)
@pytest.mark.spark  # in a subprocess
def test_kafka_benchmark_quick(tmp_path: Path) -> None:
    out = tmp_path / "results"
    assert kafka.main(["--quick", "--out", str(out)]) == 0
    report = json.loads((out / "kafka.json").read_text())
    text = (out / "kafka.md").read_text()
    assert (out / "kafka_latency_throughput.png").stat().st_size > 0
    assert report["quick"] is True and "QUICK RUN" in text
    assert report["spark_drivers"] == "one for all runs"
    assert len(report["machine"]["load_average_at_start"]) == 3

    latency, saturation, sink = report["latency"], report["saturation"], report["sink"]
    assert set(latency) == set(saturation) == MODES
    for mode, x in latency.items():
        assert x["records"] == 120 and x["trigger_s"] == 1.0, (mode, x)  # 40/s for 3 s
        cdf = x["cdf_quantiles_ms"]
        assert len(cdf) == 101 and cdf == sorted(cdf) and cdf[-1] > cdf[0], (mode, cdf)
        # Every record became visible after it was produced, within the run.
        assert 0 < cdf[0] <= x["p50_ms"] <= x["p99_ms"] <= x["max_ms"] == cdf[-1] < 600_000
        assert x["commits"] >= 1
    for mode, x in saturation.items():
        assert x["rows"] == 3000 and x["commits"] >= 3, (mode, x)
        assert x["rows_per_s"] > 0 and x["mean_batch_s"] > 0, (mode, x)
    for way in ("plain_idempotent", "kafka_sink", "engine"):
        assert sink[way]["rows_per_s"] > 0 and sink[way]["seconds"] > 0, (way, sink)
        if way != "plain_idempotent":
            ratio = sink[way]["rows_per_s"] / sink["plain_idempotent"]["rows_per_s"]
            assert sink[way]["vs_plain"] == round(ratio, 3)

    # The targets are judged from the measured figures, and the Markdown says so.
    t = report["targets"]
    rows = saturation["exactly_once"]["rows_per_s"] / saturation["at_least_once"]["rows_per_s"]
    p99 = latency["exactly_once"]["p99_ms"] / latency["at_least_once"]["p99_ms"]
    assert t["rows_per_s_ratio"] == round(rows, 3) and t["rows_per_s_met"] == (rows >= ROWS_TARGET)
    assert t["p99_ratio"] == round(p99, 3) and t["p99_met"] == (p99 <= P99_TARGET)
    for met, ratio in ((t["rows_per_s_met"], rows), (t["p99_met"], p99)):
        assert f"{'met' if met else 'MISSED'}" in text and f"({round(ratio, 3):.3f}x" in text
    # A missed target is explained from the measured figures; a met one is not.
    assert ("Why rows/s:" in text) == (not t["rows_per_s_met"])
    assert ("Why p99:" in text) == (not t["p99_met"])
