"""What a run of some parts of the scale benchmark carries over from the report before it.

``--parts`` runs some of stream, verify and day, and ``--verify-steps`` some
steps of verify; every figure not measured again is taken from the report in
``--out``, with the time it was measured, never passed off as new.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

__all__ = ["PARTS", "VERIFY_STEPS", "carried", "with_carried_steps"]

PARTS = {"stream": "stream_sf1", "verify": "verify_60m", "day": "store_day"}
VERIFY_STEPS = {"full", "buckets", "scoped", "spark"}


def carried(out: Path, parts: set[str]) -> dict[str, Any]:
    """The parts not run now, from the report in ``out`` (each marked with its ``when``)."""
    try:
        before: dict[str, Any] = json.loads((out / "scale.json").read_text())
    except (OSError, ValueError):
        before = {}
    found: dict[str, Any] = {}
    for part, key in PARTS.items():
        if part in parts:
            continue
        old = before.get(key)
        if isinstance(old, dict) and old.get("measured", True):
            # Each carried part keeps where it was measured: the report's machine
            # line is this run's, and may be another machine.
            found[key] = {**old, "when": old.get("when", before.get("when")),
                          "machine": old.get("machine", before.get("machine"))}  # fmt: skip
        else:
            found[key] = {"measured": False, "why": f"not run (--parts without {part})"}
    return found


def with_carried_steps(measured: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """``verify_60m`` measured now, over the figures of the steps not run, from ``--out``.

    The carried figures keep the time they were measured (``carried_when``);
    they are from the same scale, or none are carried.
    """
    steps = set(args.verify_steps.split(","))
    if steps >= VERIFY_STEPS:
        return measured
    try:
        report = json.loads((args.out / "scale.json").read_text())
    except (OSError, ValueError):
        report = {}
    before = report.get("verify_60m", {})
    machine = before.get("machine", report.get("machine"))
    if before.get("tpch_scale") != measured["tpch_scale"]:
        return {**measured, "steps_run": sorted(steps)}
    earlier = before.get("spark")
    if "spark" in measured and isinstance(earlier, dict) and "why" not in earlier:
        # The Spark rows not run again stay, each with its time; a row without a
        # reader predates the choice, when the store was read from file lists only.
        old = {
            key if "store_reader" in job else f"{key}_files": {
                "store_reader": "files",
                **job,
                "when": job.get("when", before.get("when")),
                "machine": job.get("machine", machine),
            }
            for key, job in earlier.items()
        }
        measured["spark"] = {**old, **measured["spark"]}
    return {**before, **measured, "steps_run": sorted(steps), "carried_when": before.get("when"),
            "carried_machine": machine}  # fmt: skip
