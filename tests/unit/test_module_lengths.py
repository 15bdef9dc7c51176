"""No Python module of the repository passes 420 lines.

Past about 400 lines a module holds more than one idea, and the next change
makes it longer still; the cure is to split it along its ideas. The rule is
checked here, over every module of the packages, the benchmarks, the examples
and the tests, so that new code cannot lose it.
"""

from __future__ import annotations

from tests.cli_run import REPO

LIMIT = 420
FOLDERS = ("reconcile", "sinks", "expected_state", "benchmarks", "examples", "tests", "scripts")


def too_long() -> list[str]:
    found = []
    for folder in FOLDERS:
        for path in sorted((REPO / folder).rglob("*.py")):
            lines = len(path.read_text().splitlines())
            if lines > LIMIT:
                found.append(f"{path.relative_to(REPO)}: {lines} lines")
    return found


def test_no_module_passes_420_lines() -> None:
    assert too_long() == []
