"""The rebuild benchmark's report says whether each target is met, from the figures alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.rebuild.report import markdown, plot


def _method(seconds: float, written: int, gap: float) -> dict[str, Any]:
    return {
        "seconds": seconds,
        "steps_s": {"copy": seconds},
        "rows_written": written,
        "rows_written_by_table": {"public.bench_rows": {"inserted": written, "updated": 0}},
        "reader": {
            "reads": 10,
            "found": 9,
            "missing": 0,
            "failed": {"55P03": 1},
            "longest_gap_s": gap,
        },
        "sink_matches_new_logic": True,
    }


def _report(by_written: int, by_seconds: float) -> dict[str, Any]:
    by = _method(by_seconds, by_written, 0.01) | {
        "call": "reconcile.rebuild.rebuild", "part_rows": 50_000, "applied": 100, "parts": 1,
        "how": "diff", "step": "switched",
        "plan": {"inserts": 0, "updates": 100, "deletes": 0, "changed": 100},
    }  # fmt: skip
    return {
        "when": "2026-01-01T00:00:00+00:00",
        "rows_written_vs_changed": by_written / 100,
        "time_vs_truncate_reload": by_seconds / 10.0,
        "targets": {"rows_written_vs_changed": 1.1, "time_vs_truncate_reload": 0.5},
        "scale": {
            "rows": 10_000,
            "changed_fraction": 0.01,
            "changed_rows": 100,
            "every_nth_key": 100,
            "setup_epochs": 2,
            "part_rows": 50_000,
        },
        "methods": {
            "truncate_reload": _method(10.0, 10_000, 10.0),
            "side_table_swap": _method(12.0, 10_000, 0.02),
            "rebuild": by,
        },
        "statistics": "counters",
        "machine": {"cpus": 2, "cpu_model": "x", "memory_gib": 1, "postgres": "15"},
    }


def _targets(text: str) -> list[str]:
    section = text.split("## Targets", 1)[1].split("##", 1)[0]
    return [line for line in section.splitlines() if line.startswith("| rows") or
            line.startswith("| rebuild")]  # fmt: skip


def test_targets_met_say_met() -> None:
    rows, time = _targets(markdown(_report(by_written=102, by_seconds=4.0)))
    assert "**met**" in rows and "**met**" in time


def test_each_missed_target_says_not_met_with_its_figure() -> None:
    rows, time = _targets(markdown(_report(by_written=111, by_seconds=5.5)))
    assert "**not met** (1.11 > 1.1)" in rows
    assert "**not met** (0.55 > 0.5)" in time
    rows, time = _targets(markdown(_report(by_written=110, by_seconds=5.0)))
    assert "**met**" in rows and "**met**" in time  # the targets are "at most"


def test_the_figure_is_written(tmp_path: Path) -> None:
    plot(_report(by_written=102, by_seconds=4.0), tmp_path)
    assert (tmp_path / "rebuild.png").stat().st_size > 10_000
