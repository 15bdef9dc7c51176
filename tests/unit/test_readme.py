"""The README's and the docs' Python examples run as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
# Documents whose Python blocks form one runnable program each (later blocks use
# names that earlier ones define).
RUNNABLE = [README, ROOT / "docs" / "sinks.md"]


@pytest.mark.parametrize("document", RUNNABLE, ids=[p.name for p in RUNNABLE])
def test_python_examples_run(document: Path) -> None:
    blocks = re.findall(r"```python\n(.*?)```", document.read_text(), flags=re.S)
    assert len(blocks) >= 3
    namespace: dict[str, object] = {"__name__": f"example_{document.stem}"}
    for block in blocks:
        exec(compile(block, str(document), "exec"), namespace)


def test_readme_commands_are_what_ci_runs() -> None:
    text = README.read_text()
    ci = (README.parent / ".ci" / "run").read_text()
    assert "scripts/test" in text and "scripts/test" in ci
    assert "scripts/demo" in text
    assert "../shared" not in text  # the README stands alone
