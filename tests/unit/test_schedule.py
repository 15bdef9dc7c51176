"""The run's order (tests/fix_schedule.py): the long tests first, unless a failure ends the run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FILES = [
    "tests/chaos/test_ha.py",  # a Spark pipeline pair, with a limit of its own
    "tests/integration/test_hashing_spark.py",  # Spark, the default limit
    "tests/integration/test_heavy_sessions.py",  # a server, no Spark
    "tests/unit/test_executor_errors.py",  # neither
]


def _order(*options: str) -> list[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         "-p", "no:xdist", *options, *FILES],
        cwd=REPO, capture_output=True, text=True, check=True,
    )  # fmt: skip
    files = [line.split("::", 1)[0] for line in proc.stdout.splitlines() if "::" in line]
    return list(dict.fromkeys(files))


def test_a_whole_run_starts_the_longest_tests_first() -> None:
    assert _order()[0] == "tests/chaos/test_ha.py"


def test_a_run_that_stops_at_its_first_failure_starts_the_cheapest() -> None:
    assert _order("-x") == list(reversed(FILES))
    assert _order("--maxfail", "1") == list(reversed(FILES))
