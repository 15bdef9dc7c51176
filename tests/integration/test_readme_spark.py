"""The README's Spark examples (```python spark blocks) run as written, on the shared session."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.spark]

README = Path(__file__).resolve().parents[2] / "README.md"


def test_spark_examples_run(spark: Any) -> None:
    blocks = re.findall(r"```python spark\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "the README has no Spark example"
    for block in blocks:
        # The example's getOrCreate() returns the running session.
        exec(compile(block, str(README), "exec"), {"__name__": "example_spark"})
