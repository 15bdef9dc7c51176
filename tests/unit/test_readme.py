"""The README's Python examples run as written."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_python_examples_run() -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert len(blocks) >= 3
    namespace: dict[str, object] = {}
    for block in blocks:  # later blocks use names defined by earlier ones
        exec(compile(block, str(README), "exec"), namespace)


def test_readme_commands_are_what_ci_runs() -> None:
    text = README.read_text()
    ci = (README.parent / ".ci" / "run").read_text()
    assert "scripts/test" in text and "scripts/test" in ci
    assert "scripts/demo" in text
