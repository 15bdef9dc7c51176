"""docs/operations.md: its Python examples run as written, and it documents every series."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from reconcile.cli.prometheus import PrometheusMetrics

ROOT = Path(__file__).resolve().parents[2]
OPERATIONS = ROOT / "docs" / "operations.md"


def test_the_python_examples_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # the config example reads examples/reconcile.toml
    blocks = re.findall(r"```python\n(.*?)```", OPERATIONS.read_text(), flags=re.S)
    assert len(blocks) >= 4
    namespace: dict[str, object] = {"__name__": "example_operations"}
    for block in blocks:
        exec(compile(block, str(OPERATIONS), "exec"), namespace)


def test_every_series_is_documented() -> None:
    text = OPERATIONS.read_text()
    families = {
        name
        for collector in PrometheusMetrics().registry._collector_to_names
        for family in collector.describe()
        for name in [family.name + ("_total" if family.type == "counter" else "")]
    }
    assert len(families) >= 17
    missing = sorted(f for f in families if f"`{f}`" not in text)
    assert not missing, f"series not documented in docs/operations.md: {missing}"
    assert "alert: ReconcileCommitFatal" in text and "reconcile_commit_fatal_total" in text
