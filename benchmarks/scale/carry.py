"""What a run of some parts of the scale benchmark carries over from the report before it.

``--parts`` runs some of stream, verify and day, and ``--verify-steps`` some
steps of verify; every figure not measured again is taken from the report in
``--out``, with the time it was measured, never passed off as new.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["PARTS", "VERIFY_STEPS", "carried", "previous", "with_carried_steps"]

PARTS = {"stream": "stream_sf1", "verify": "verify_60m", "day": "store_day"}
VERIFY_STEPS = {"full", "buckets", "scoped", "spark"}


def previous(out: Path) -> dict[str, Any]:
    """The report in ``out`` (``scale.json``); empty where there is none, or it does not parse."""
    try:
        report: dict[str, Any] = json.loads((out / "scale.json").read_text())
    except (OSError, ValueError):
        return {}
    return report


def _dated(figure: dict[str, Any], *around: dict[str, Any]) -> dict[str, Any]:
    """``figure`` with when and on which machine it was measured: its own, else its nearest
    enclosing part's. A carried figure keeps both: the report's machine line is this run's."""
    found = {**figure}
    for key in ("when", "machine"):
        found[key] = next((d[key] for d in (figure, *around) if key in d), None)
    return found


def carried(before: dict[str, Any], parts: set[str]) -> dict[str, Any]:
    """The parts not run now, from the report ``before`` (each dated, with its machine)."""
    found: dict[str, Any] = {}
    for part, key in PARTS.items():
        if part in parts:
            continue
        old = before.get(key)
        if isinstance(old, dict) and old.get("measured", True):
            found[key] = _dated(old, before)
        else:
            found[key] = {"measured": False, "why": f"not run (--parts without {part})"}
    return found


def with_carried_steps(
    measured: dict[str, Any], steps: set[str], report: dict[str, Any]
) -> dict[str, Any]:
    """``verify_60m`` measured now in ``steps``, over the other steps' figures in ``report``.

    The carried figures keep the time and machine they were measured on
    (``carried_when``, ``carried_machine``); they are from the same scale, or
    none are carried.
    """
    if steps >= VERIFY_STEPS:
        return measured
    before = report.get("verify_60m", {})
    if before.get("tpch_scale") != measured["tpch_scale"]:
        return {**measured, "steps_run": sorted(steps)}
    earlier = before.get("spark")
    if "spark" in measured and isinstance(earlier, dict) and "why" not in earlier:
        # The Spark rows not run again stay, each with its time; a row without a
        # reader predates the choice, when the store was read from file lists only.
        old = {
            key if "store_reader" in job else f"{key}_files": _dated(
                {"store_reader": "files", **job}, before, report
            )
            for key, job in earlier.items()
        }
        measured["spark"] = {**old, **measured["spark"]}
    where = _dated({}, before, report)
    return {**before, **measured, "steps_run": sorted(steps), "carried_when": where["when"],
            "carried_machine": where["machine"]}  # fmt: skip
