"""docs/operations.md documents every series (its examples run in tests/docs/test_docs.py)."""

from __future__ import annotations

from pathlib import Path

from reconcile.cli.prometheus import PrometheusMetrics

ROOT = Path(__file__).resolve().parents[2]
OPERATIONS = ROOT / "docs" / "operations.md"


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
