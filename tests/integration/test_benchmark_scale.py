"""Smoke test of the scale benchmark: ``--quick`` runs every measured part and reports it.

``benchmarks.scale --quick`` (TPC-H scale 0.01, full mode in parts of 10,000
rows, 300 epochs of the store) into a temporary folder: the report has every
key the issue names, the parts verify found no drift and pulled every row,
scoped recovery found exactly the divergent rows, each measurement names its
own peak memory, and the plots are written.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import scale

pytestmark = [pytest.mark.slow, pytest.mark.integration]


@pytest.mark.timeout(1200)  # about a minute alone; a PostgreSQL server and eight processes
def test_scale_benchmark_quick(tmp_path: Path) -> None:
    out = tmp_path / "results"
    out.mkdir()
    assert scale.main(["--quick", "--out", str(out), "--workdir", str(tmp_path)]) == 0
    report = json.loads((out / "scale.json").read_text())
    for key in ("stream_sf1", "eo_vs_alo_rows_per_s_min", "executors_vs_alo_rows_per_s_min",
                "verify_60m", "store_day", "machine", "versions"):  # fmt: skip
        assert key in report, key
    assert report["quick"] is True and report["stream_sf1"]["measured"] is False
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
    day = report["store_day"]
    assert day["epochs"] == 300 and day["last_epoch_read"] == 300
    assert day["commit_first"]["epochs"] == day["commit_last"]["epochs"] == 100
    assert day["open_s"] > 0 and day["disk_mb"] > 0 and len(day["rss_over_time"]) > 10
    assert (out / "scale_verify.png").stat().st_size > 0
    assert (out / "scale_store_day.png").stat().st_size > 0
    text = (out / "scale.md").read_text()
    assert "60,175 rows" in text and "smoke run" in text
