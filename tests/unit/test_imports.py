"""Every module of ``sinks`` and ``expected_state`` imports on its own, as the first one.

A Spark worker imports whatever module a pickled task names first
(``sinks.delta.sink``, ``expected_state.parts``). The core lives inside
``reconcile``, whose ``__init__`` exports the cycle and ``recover``, which use
the store and the registry: so the two packages import ``reconcile.core``
before any module of theirs, and none of their modules is ever half-run when
``reconcile`` asks for it. This checks that arrangement where it matters, in
a fresh interpreter, which the rest of the suite (everything in one process)
never is. A module of ``reconcile`` always runs after ``reconcile/__init__``
whole, and the import contract (``lint-imports``) keeps the layers acyclic.
One subprocess imports each module with the engine's packages dropped from
``sys.modules`` before each, so every module gets to be the first one.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("reconcile", "sinks", "expected_state")
FIRST = ("sinks", "expected_state")  # the packages below reconcile that a worker may import first

SCRIPT = """
import importlib, json, sys, traceback
packages = tuple(sys.argv[1].split(","))
failures = {}
for name in sys.argv[2:]:
    for loaded in [m for m in sys.modules if m.split(".")[0] in packages]:
        del sys.modules[loaded]
    try:
        importlib.import_module(name)
    except Exception:
        failures[name] = traceback.format_exc(limit=-3)
print(json.dumps(failures))
"""


def engine_modules() -> list[str]:
    names = []
    for package in FIRST:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            if parts[-1] == "__main__":
                continue  # runs the CLI when imported
            if parts[-1] == "__init__":
                parts = parts[:-1]
            names.append(".".join(parts))
    return names


# The modules a Spark worker is known to import first (its pickled tasks name them), each
# checked alone first: a second each, before the sweep below over every module (half a
# minute), so a run that stops at its first failure stops here.
WORKER_FIRST = ("sinks.delta.sink", "expected_state.delta_files")


@pytest.mark.parametrize("module", WORKER_FIRST)
def test_a_module_a_worker_imports_first_imports_alone(module: str) -> None:
    proc = subprocess.run([sys.executable, "-c", f"import {module}"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_every_module_imports_first_in_a_fresh_interpreter() -> None:
    modules = engine_modules()
    assert "sinks.delta.sink" in modules and "expected_state.delta_files" in modules
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, ",".join(PACKAGES), *modules],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    failures = json.loads(proc.stdout.strip().splitlines()[-1])
    assert failures == {}, "\n".join(f"{name}:\n{tb}" for name, tb in failures.items())
