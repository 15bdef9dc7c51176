"""The sink benchmarks' one command, run small: every part measured, the report whole.

The figures are not asserted (targets belong to the benchmark's own run); the
report's shape is, and that each part's verify pulled every row it wrote.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.sinks import bench as sinks

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_one_command_measures_every_sink_beside_postgres(tmp_path: Path) -> None:
    assert sinks.main(["--small-epochs", "12", "--big-rows", "20000", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "sinks.json").read_text())
    assert list(report["parts"]) == ["postgres", "mariadb", "iceberg", "s3_files"]
    for name, part in report["parts"].items():
        assert part["small_epoch_commit"]["epochs"] == 12 - 1, name  # the first is warm-up
        assert part["big_epoch"]["rows"] == 20000, name
        assert part["full_verify"]["rows"] == 12 * 100 + 20000, name
        for figure in (part["big_epoch"], part["full_verify"]):
            assert figure["rows_per_s"] > 0 and figure["client_cpu_s"] >= 0, name
        # CPU time is counted in clock ticks (10 ms): 20,000 rows take several.
        assert part["big_epoch"]["client_cpu_s"] > 0, name
    # The servers' CPU is counted for the parts that have a server, not for Iceberg's.
    assert report["parts"]["postgres"]["big_epoch"]["server_cpu_s"] > 0
    assert report["parts"]["iceberg"]["big_epoch"]["server_cpu_s"] == 0
    text = (tmp_path / "sinks.md").read_text()
    assert "## What bounds each sink" in text and "Beside PostgreSQL" in text
    for part in report["parts"].values():
        assert part["sink"] in text
    assert (tmp_path / "sinks.png").stat().st_size > 10_000


@pytest.mark.parametrize(
    ("client", "server", "says"),
    [(0.9, 0.1, "the client's CPU"), (0.2, 0.7, "the server's CPU"), (0.2, 0.3, "waits"),
     (0.6, 0.6, "the client's CPU"), (0.59, 0.59, "the two CPUs"), (0.3, 0.3, "the two CPUs")],
)  # fmt: skip
def test_what_bounds_a_figure(client: float, server: float, says: str) -> None:
    figure = {"seconds": 2.0, "client_cpu_s": 2 * client, "server_cpu_s": 2 * server}
    assert sinks.bound(figure).startswith(says)
