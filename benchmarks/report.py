"""What every benchmark report says about where it ran, and how reports are written."""

from __future__ import annotations

import json
import os
import platform
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = ["RESULTS", "machine", "now", "versions", "write_report"]

RESULTS = Path(__file__).resolve().parent / "results"


def machine(**extra: Any) -> dict[str, Any]:
    """The machine: platform, CPU model and count, memory (from /proc where there is one)."""
    model = ""
    mem_kb = 0
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem_kb = int(line.split()[1])
                break
    except OSError:
        pass
    return {
        "platform": platform.platform(),
        "cpu_model": model or platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "memory_gib": round(mem_kb / 2**20, 1),
        **extra,
    }


def versions(*packages: str) -> dict[str, str]:
    """Python's version and each installed package's (its distribution name)."""
    found = {"python": platform.python_version()}
    for name in packages:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = "not installed"
    return found


def now() -> str:
    """The run's time, UTC, to the second."""
    return datetime.now(UTC).isoformat(timespec="seconds")


def write_report(name: str, report: dict[str, Any], markdown: str, out: Path = RESULTS) -> None:
    """Write ``<out>/<name>.json`` and ``<out>/<name>.md``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / f"{name}.md").write_text(markdown)
