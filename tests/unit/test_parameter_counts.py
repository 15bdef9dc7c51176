"""No function or constructor of the library takes more than 8 parameters.

Past that, a call site cannot be read without the signature beside it, and
flags start to interact; the cure is an options object (a frozen dataclass or a
TypedDict of keywords), which counts as one parameter. The rule is checked
here, over every module of the three packages, so that new code cannot lose it.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.cli_run import REPO

LIMIT = 8
PACKAGES = ("reconcile", "sinks", "expected_state")


def too_many() -> list[str]:
    found = []
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    continue
                args = node.args
                names = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
                names = [n for n in names if n not in ("self", "cls")]
                if len(names) > LIMIT:
                    where = Path(path).relative_to(REPO)
                    found.append(f"{where}:{node.lineno} {node.name}() takes {len(names)}")
    return found


def test_no_function_takes_more_than_eight_parameters() -> None:
    assert too_many() == []
