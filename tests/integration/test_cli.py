"""The ``reconcile`` CLI end to end: the demo under chaos, resume, status, bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from reconcile.cli import main
from reconcile.demo.files import audit

pytestmark = pytest.mark.integration


def test_demo_under_chaos_audits_clean(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "demo"
    assert (
        main(["demo", "--files", "--out", str(out), "--epochs", "12", "--rows", "50", "--json"])
        == 0
    )
    report = json.loads(capsys.readouterr().out)
    assert report["audit_ok"] and report["audit_problems"] == []
    assert report["faults_fired"], "the chaos plan fired nothing"
    assert report["rows_committed"]["orders"] == 12 * 50
    # The audit is independent evidence: it reads the batch files, and it can fail.
    assert audit(out, 12, 50) == ([], report["rows_committed"])
    committed = out / "sinks" / "orders" / "committed"
    next(committed.glob("*-3-g*.batch")).unlink()  # a lost epoch
    twin = next(committed.glob("*-5-g*.batch"))  # a duplicated epoch
    (committed / "demo-orders-5-g99.batch").write_bytes(twin.read_bytes())
    problems, _ = audit(out, 12, 50)
    assert "orders: epoch 3 committed 0 times" in problems
    assert "orders: epoch 5 committed 2 times" in problems


def test_demo_resumes_from_the_last_committed_epoch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "demo"
    assert (
        main(["demo", "--files", "--out", str(out), "--epochs", "5", "--rows", "10", "--no-chaos"])
        == 0
    )
    capsys.readouterr()
    assert (
        main(["demo", "--files", "--out", str(out), "--epochs", "8", "--rows", "10", "--json"]) == 0
    )
    report = json.loads(capsys.readouterr().out)
    assert report["resumed_from"] == 4 and report["audit_ok"]
    assert main(["status", "--state", str(out / "state"), "--pipeline", "demo", "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["finalized"] == list(range(8)) and status["last_committed"] == 7


def test_console_script_and_bad_input(tmp_path: Path) -> None:
    ok = subprocess.run(
        [
            sys.executable,
            "-m",
            "reconcile.cli",
            "demo",
            "--files",
            "--out",
            str(tmp_path / "d"),
            "--epochs",
            "3",
            "--rows",
            "5",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ok.returncode == 0, ok.stderr
    assert "audit: OK" in ok.stdout and "epoch 3/3 committed" in ok.stderr
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "reconcile.cli",
            "demo",
            "--files",
            "--out",
            str(tmp_path / "e"),
            "--epochs",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "--epochs must be >= 1" in bad.stderr
    missing = subprocess.run(
        [
            sys.executable,
            "-m",
            "reconcile.cli",
            "status",
            "--state",
            str(tmp_path / "nope"),
            "--pipeline",
            "demo",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert missing.returncode == 2 and "no progress log folder" in missing.stderr
