"""Smoke test of the scale benchmark: ``--quick`` runs every measured part and reports it.

``benchmarks.scale --quick`` (TPC-H scale 0.01: the stream in four modes at
two batch sizes, full mode in parts of 10,000 rows, 300 epochs of the store)
into a temporary folder: the report has every key the benchmark publishes,
every streaming run lost and duplicated no line and names its batches, its
ways of staging and its memory, the parts verify found no drift and pulled
every row, scoped recovery found exactly the divergent rows, each
measurement names its own peak memory, and the plots are written.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.scale import bench as scale

pytestmark = [pytest.mark.slow, pytest.mark.integration]


@pytest.mark.timeout(1800)  # about 8 minutes alone: ten Spark drivers, eight more processes
def test_scale_benchmark_quick(tmp_path: Path) -> None:
    out = tmp_path / "results"
    out.mkdir()
    assert scale.main(["--quick", "--out", str(out), "--workdir", str(tmp_path)]) == 0
    check_quick_report(out)


def check_quick_report(out: Path) -> None:
    """What a quick run's report in ``out`` must show."""
    report = json.loads((out / "scale.json").read_text())
    for key in ("stream_sf1", "eo_vs_alo_rows_per_s_min", "executors_vs_alo_rows_per_s_min",
                "verify_60m", "store_day", "machine", "versions"):  # fmt: skip
        assert key in report, key
    assert report["quick"] is True
    stream = report["stream_sf1"]
    assert stream["measured"] is True and stream["lineitem_rows"] == 60_175
    for size, runs in stream["by_batch_rows"].items():
        assert int(size) / 2 <= runs["rows_per_file"] <= int(size) * 3 / 2, (size, runs)
        for mode in ("at_least_once", "pull_and_diff", "pull_and_diff_via_executors",
                     "two_phase_30s"):  # fmt: skip
            figures = runs[mode]
            # Checked against TPC-H by the benchmark itself; the warm-up file's lines left out.
            assert figures["duplicates"] == figures["missing"] == 0, (mode, figures)
            assert 0 < figures["rows"] < 60_175 and figures["rows_per_s"] > 0, (mode, figures)
            assert figures["batches"] == runs["files"] - 1, (mode, figures)
            assert figures["batch_ms_p50"] <= figures["batch_ms_p99"], (mode, figures)
            assert 100 < figures["peak_mb_driver"] < 8192, (mode, figures)
        # Only the engine's executor path stages on the executors, and its Python
        # workers are sampled; every path's batches are counted by the way they took.
        # (the revenue sink's rows are an Arrow table the driver computed: "arrow").
        for mode, way in (("pull_and_diff_via_executors", "executors"),
                          ("pull_and_diff", "collect")):  # fmt: skip
            assert runs[mode]["staged_via"] == {way: runs["files"] - 1, "arrow": runs["files"] - 1}
        assert runs["pull_and_diff_via_executors"]["peak_mb_executors"] > 10, runs
        assert runs["eo_vs_alo"] > 0 and runs["executors_vs_alo"] > 0, runs
    ratios = [r["eo_vs_alo"] for r in stream["by_batch_rows"].values()]
    assert report["eo_vs_alo_rows_per_s_min"] == min(ratios)
    verify = report["verify_60m"]
    assert verify["rows"] == 60_175 and verify["epochs"] == 4
    for way in ("full_in_parts", "full_in_memory", "buckets_first", "buckets_kept_summary"):
        figures = verify[way]
        # Full mode pulls every row; buckets mode none, where no checksum differs.
        pulled = 0 if way.startswith("buckets") else 60_175
        assert figures["rows_pulled"] == pulled, (way, figures)
        assert figures["missing"] == figures["extra"] == figures["changed"] == 0, (way, figures)
        assert 50 < figures["peak_rss_mb"] < 4096 and figures["seconds"] > 0, (way, figures)
    assert verify["buckets_kept_summary"]["buckets_compared"] > 0
    assert verify["full_in_parts"]["mode"] == "full"
    assert verify["divergent_rows"] == 1000
    scoped, full = verify["scoped_divergent"], verify["full_divergent"]
    assert scoped["mode"] == "scoped" and (scoped["missing"], scoped["changed"]) == (500, 500)
    assert (full["missing"], full["changed"], full["extra"]) == (500, 500, 0)
    assert verify["copy_out"]["bytes"] > 1_000_000
    # Each master with each reader of the store: the file lists and delta-spark.
    masters = {"local": "local[2]", "local_cluster": "local-cluster[2,1,1024]"}
    assert set(verify["spark"]) == {f"{m}_{r}" for m in masters for r in ("files", "delta-spark")}
    for name, job in verify["spark"].items():
        master, reader = name.rsplit("_", 1)
        assert job["master"] == masters[master] and job["store_reader"] == reader, job
        assert job["rows_pulled"] == 60_175, job
        assert job["missing"] == job["extra"] == job["changed"] == 0, job
        assert 0 < job["job_seconds"] < job["seconds"] and job["peak_mb_driver"] > 100, job
    # Two executor JVMs of their own on local-cluster, sampled as executors.
    assert verify["spark"]["local_cluster_delta-spark"]["peak_mb_executors"] > 100
    day = report["store_day"]
    assert day["epochs"] == 300 and day["last_epoch_read"] == 300
    assert day["commit_first"]["epochs"] == day["commit_last"]["epochs"] == 100
    assert day["open_s"] > 0 and day["disk_mb"] > 0 and len(day["rss_over_time"]) > 10
    assert (out / "scale_verify.png").stat().st_size > 0
    assert (out / "scale_store_day.png").stat().st_size > 0
    assert (out / "scale_stream.png").stat().st_size > 0
    text = (out / "scale.md").read_text()
    assert "60,175 rows" in text and "smoke run" in text
