"""The scale benchmark's verify part run in some of its steps: the others are carried, dated.

A run of only the Spark rows keeps the earlier run's other figures and its
Spark rows not run again, each with the time it was measured; a row of a run
before the reader choice is the file lists' row.
"""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.scale.carry import previous, with_carried_steps
from benchmarks.scale.report import _spark_rows


def _job(master: str, seconds: float, **extra: object) -> dict[str, object]:
    return {"master": master, "partitions": 64, "seconds": seconds, "job_seconds": seconds - 10,
            "peak_mb_driver": 1000.0, "peak_mb_executors": None, **extra}  # fmt: skip


def test_a_spark_only_run_keeps_the_other_steps_and_dates_the_rows_it_carries(
    tmp_path: Path,
) -> None:
    before = {
        "tpch_scale": 10.0, "rows": 60, "when": "2026-11-28T00:32:34+00:00",
        "full_in_parts": {"seconds": 138.4},
        "spark": {"local": _job("local[2]", 332.2), "local_cluster": _job("local-cluster", 371.8)},
    }  # fmt: skip
    intel = {"cpus": 2, "cpu_model": "Intel", "memory_gib": 23.5, "platform": "Linux"}
    (tmp_path / "scale.json").write_text(json.dumps({"verify_60m": before, "machine": intel}))
    measured = {
        "tpch_scale": 10.0, "rows": 60, "when": "2026-11-29T13:00:00+00:00",
        "spark": {
            "local_files": _job("local[2]", 300.0, store_reader="files"),
            "local_delta-spark": _job("local[2]", 250.0, store_reader="delta-spark"),
        },
    }  # fmt: skip
    got = with_carried_steps(measured, {"spark"}, previous(tmp_path))
    assert got["full_in_parts"] == {"seconds": 138.4}
    assert got["carried_when"] == before["when"] and got["steps_run"] == ["spark"]
    assert got["when"] == measured["when"]
    spark = got["spark"]
    assert set(spark) == {"local_files", "local_delta-spark", "local_cluster_files"}
    # Measured now: the new figure, no date of its own; carried: the old one, dated.
    assert spark["local_files"]["seconds"] == 300.0 and "when" not in spark["local_files"]
    assert spark["local_cluster_files"]["seconds"] == 371.8
    assert spark["local_cluster_files"]["when"] == before["when"]
    assert spark["local_cluster_files"]["store_reader"] == "files"
    # Carried figures keep the machine they were measured on, named where it differs.
    assert spark["local_cluster_files"]["machine"] == intel == got["carried_machine"]
    amd = {**intel, "cpu_model": "AMD"}
    rows = _spark_rows(got, {"machine": amd})
    # Three jobs, and delta-spark's time over the file lists' beside it (240 s / 290 s).
    assert len(rows) == 4 and sum("measured 2026-11-28" in r for r in rows) == 1
    assert "side by side | **0.828** |" in rows[-1]
    assert sum("on 2 CPUs (Intel)" in r for r in rows) == 1
    assert sum("read by delta-spark" in r for r in rows) == 1


def test_a_run_of_every_step_carries_nothing(tmp_path: Path) -> None:
    (tmp_path / "scale.json").write_text(json.dumps({"verify_60m": {"tpch_scale": 10.0, "x": 1}}))
    measured = {"tpch_scale": 10.0, "when": "now"}
    every = {"buckets", "full", "scoped", "spark"}
    assert with_carried_steps(measured, every, previous(tmp_path)) == measured


def test_figures_of_another_scale_are_never_carried(tmp_path: Path) -> None:
    (tmp_path / "scale.json").write_text(json.dumps({"verify_60m": {"tpch_scale": 10.0, "x": 1}}))
    got = with_carried_steps({"tpch_scale": 0.01, "when": "now"}, {"spark"}, previous(tmp_path))
    assert "x" not in got and "carried_when" not in got


def test_a_step_neither_run_nor_carried_is_shown_as_not_run() -> None:
    from benchmarks.scale.report import _verify

    machine = {"cpus": 2, "cpu_model": "x", "memory_gib": 1, "platform": "p"}
    part = {"tpch_scale": 0.1, "rows": 10, "epochs": 2, "chunk_rows": 5, "when": "t",
            "buckets_first": {"seconds": 1.5, "peak_rss_mb": 20.0}}  # fmt: skip
    text = "\n".join(_verify({"when": "t", "machine": machine, "verify_60m": part}))
    assert "| buckets mode, first check (computes the summary) | 1.5 s, peak RSS 20.0 MB |" in text
    assert "| full verify, in parts | not run |" in text
    assert "| scoped / full | not run |" in text
