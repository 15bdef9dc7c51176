"""The sink benchmarks, one command: each sink's part measured and written into one report.

``python -m benchmarks.sinks [--only PART ...] [--small-epochs N] [--big-rows N]``

Each part is a module of its own (``benchmarks/sinks_<part>.py``) with
``run(small_epochs, big_rows)``, ``markdown(part)`` and ``plot(part, path)``.
A run measures the parts asked for and keeps the others' figures from the
last report: ``benchmarks/results/sinks.{json,md}`` and ``sinks_<part>.png``.
"""

from __future__ import annotations

import argparse
import importlib
import json
from typing import Any

from benchmarks.report import RESULTS, machine, now, versions, write_report

__all__ = ["PARTS", "main"]

# part -> its module (run, markdown, plot).
PARTS = {"mariadb": "benchmarks.sinks_mariadb"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", choices=sorted(PARTS), default=sorted(PARTS))
    parser.add_argument("--small-epochs", type=int, default=200)
    parser.add_argument("--big-rows", type=int, default=1_000_000)
    args = parser.parse_args(argv)
    path = RESULTS / "sinks.json"
    report: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {"parts": {}}
    for name in args.only:
        module = importlib.import_module(PARTS[name])
        print(f"sinks: measuring {name}", flush=True)
        part = module.run(args.small_epochs, args.big_rows)
        part["measured_at"] = now()
        report["parts"][name] = part
        module.plot(part, RESULTS / f"sinks_{name}.png")
    report["machine"] = machine()
    report["versions"] = versions("sqlalchemy", "PyMySQL", "psycopg", "pyarrow")
    sections = [
        importlib.import_module(PARTS[name]).markdown(part)
        for name, part in sorted(report["parts"].items())
        if name in PARTS
    ]
    text = "# Sink benchmarks\n\n" + "\n".join(sections)
    write_report("sinks", report, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
