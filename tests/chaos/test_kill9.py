"""A real ``kill -9`` of a file-sink pipeline at named points, then a restart."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fix_sinks import FileHarness
from tests.invariants import SINKS, Scenario

pytestmark = [pytest.mark.chaos, pytest.mark.integration]

REPO = Path(__file__).resolve().parents[2]
EPOCHS = 4

# (failure-matrix row, point, nth hit, before/after). nth=2: during epoch 1.
KILL_POINTS = [
    ("stage", "sink.alpha.stage", 2, "after"),
    ("record_expected_state", "cycle.record_progress", 2, "after"),
    ("prepare-midway", "sink.alpha.prepare", 2, "after"),
    ("prepare-done", "sink.beta.prepare", 2, "after"),
    ("commit-progress-written", "cycle.commit_progress", 2, "after"),
    ("commit-first-sink", "sink.alpha.commit", 2, "after"),
    ("after_commit_before_ack", "sink.beta.commit", 2, "after"),
    ("finalize", "cycle.finalize", 2, "before"),
    ("engine_crash-before-commit-progress", "cycle.commit_progress", 2, "before"),
]


def _run(root: Path, *fault: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tests.chaos.kill_pipeline", str(root), str(EPOCHS), *fault],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("row", "point", "nth", "when"), KILL_POINTS, ids=[k[0] for k in KILL_POINTS]
)
def test_kill9_then_restart_converges(
    row: str, point: str, nth: int, when: str, tmp_path: Path
) -> None:
    killed = _run(tmp_path, point, str(nth), when)
    assert killed.returncode == -signal.SIGKILL, (row, killed.stdout, killed.stderr)
    harness = FileHarness(tmp_path / "sinks")
    # Something of epoch 1 is on disk, half-done: that is the point of the test.
    restarted = _run(tmp_path)
    assert restarted.returncode == 0, restarted.stderr
    Scenario(harness, tmp_path / "state", sinks=SINKS).check(list(range(EPOCHS)))
    for name in SINKS:
        # No epoch committed twice: exactly one committed batch file per epoch.
        files = sorted(p.name for p in (tmp_path / "sinks" / name / "committed").iterdir())
        assert len(files) == EPOCHS, files
