"""The ``reconcile`` command line run as a real process, as cron or an operator runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m reconcile.cli ARGS`` from the repository, its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "reconcile.cli", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
        timeout=300,
    )
