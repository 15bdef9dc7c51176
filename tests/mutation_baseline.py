"""The mutation check's baseline: every kill set's tests, unmutated, in one parallel pytest run.

A kill counts only if the kill tests pass without the mutant. Running each kill
set on its own (about 250 of them) cost a pytest start, a PostgreSQL server and
often a Spark session each: nearly half of the whole check. Here the kill sets
that are plain pytest selections (paths or node ids, with ``-k`` and ``-m``)
run as one session with pytest-xdist, and this module, loaded into it as a
plugin, records which tests each kill set selects and how each test ended.
A kill set passes its baseline when it selects at least one test and every
test it selects passed. Kill sets with other pytest options keep a run of
their own.

The same plugin, loaded into any other run with ``RECONCILE_MUTATION_BASELINE``
set to a folder that holds no ``groups.json``, only records how every test
ended (CI's default and slow runs do): the mutation check then takes those
outcomes as the baseline of the tests they cover, and runs only the rest.

The selection is pytest's own: ``-k`` and ``-m`` are evaluated with pytest's
expression and matcher classes (``_pytest.mark``, not public API, so the import
is guarded: without them every kill set runs alone, as before).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

__all__ = [
    "ENV",
    "Selection",
    "available",
    "parse",
    "recorded",
    "root_paths",
    "selected",
    "selection_of",
]

ENV = "RECONCILE_MUTATION_BASELINE"  # the folder of groups.json, selection-*.json, outcomes.json


@dataclass(frozen=True)
class Selection:
    """A kill set as a pytest selection: positional arguments, ``-k`` and ``-m``."""

    paths: tuple[str, ...]
    keyword: str = ""
    marker: str = ""

    def as_json(self) -> dict[str, Any]:
        return {"paths": list(self.paths), "keyword": self.keyword, "marker": self.marker}


def parse(kill: Sequence[str], marker: str) -> Selection | None:
    """The selection ``kill`` (pytest arguments) and ``marker`` make, or None if it is not one.

    Only positional arguments, ``-k EXPR`` and ``-m EXPR`` are understood; any
    other option makes the kill set run on its own.
    """
    paths: list[str] = []
    keyword, markexpr = "", marker
    args = iter(kill)
    for arg in args:
        if arg in ("-k", "-m"):
            value = next(args, None)
            if value is None:
                return None
            if arg == "-k":
                if keyword:
                    return None
                keyword = value
            else:
                markexpr = f"({markexpr}) and ({value})" if markexpr else value
        elif arg.startswith("-"):
            return None
        else:
            paths.append(arg)
    return Selection(tuple(paths), keyword, markexpr) if paths else None


def available() -> bool:
    """Whether pytest's matcher classes are importable here (else: one run per kill set)."""
    try:
        from _pytest.mark import KeywordMatcher, MarkMatcher  # noqa: F401
        from _pytest.mark.expression import Expression  # noqa: F401
    except ImportError:
        return False
    return True


def root_paths(selections: Iterable[Selection]) -> list[str]:
    """The files and folders to collect for ``selections`` (node ids cut to their file)."""
    return sorted({p.split("::", 1)[0] for s in selections for p in s.paths})


def selected(selections: Sequence[Selection], folder: Path) -> list[list[str]]:
    """The node ids each selection selected, as a run with the plugin wrote them (any worker's)."""
    found = sorted(folder.glob("selection-*.json"))
    if not found:
        raise RuntimeError("the baseline run recorded no selection (did it collect at all?)")
    chosen: list[list[str]] = json.loads(found[0].read_text())
    if len(chosen) != len(selections):
        raise RuntimeError("the baseline run's selection does not match its kill sets")
    return chosen


def recorded(folders: Iterable[Path]) -> dict[str, str]:
    """The outcomes the runs that recorded into ``folders`` wrote; a failure anywhere wins."""
    outcomes: dict[str, str] = {}
    for folder in folders:
        path = folder / "outcomes.json"
        if not path.exists():
            continue
        for nodeid, outcome in json.loads(path.read_text()).items():
            if outcomes.get(nodeid) != "failed":
                outcomes[nodeid] = outcome
    return outcomes


# -- the plugin, in the baseline run ---------------------------------------------------------


def _matches_path(nodeid: str, path: str) -> bool:
    path = path.rstrip("/")
    if "::" in path:
        return nodeid == path or nodeid.startswith((path + "[", path + "::"))
    return nodeid == path or nodeid.startswith((path + "::", path + "/"))


def selection_of(items: Iterable[pytest.Item], selection: Selection) -> list[str]:
    """The node ids of ``items`` that ``selection`` selects, by pytest's own rules."""
    from _pytest.mark import KeywordMatcher, MarkMatcher
    from _pytest.mark.expression import Expression

    keyword = Expression.compile(selection.keyword) if selection.keyword else None
    marker = Expression.compile(selection.marker) if selection.marker else None
    chosen = []
    for item in items:
        if not any(_matches_path(item.nodeid, p) for p in selection.paths):
            continue
        if keyword is not None and not keyword.evaluate(KeywordMatcher.from_item(item)):
            continue
        if marker is not None and not marker.evaluate(
            MarkMatcher.from_markers(item.iter_markers())
        ):
            continue
        chosen.append(item.nodeid)
    return chosen


def _folder() -> Path | None:
    value = os.environ.get(ENV)
    return Path(value) if value else None


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep only the tests some kill set selects; write what each selects."""
    folder = _folder()
    if folder is None or not (folder / "groups.json").exists():
        return  # recording only: every test runs, its outcome is written at the end
    groups = [Selection(tuple(g["paths"]), g["keyword"], g["marker"]) for g in
              json.loads((folder / "groups.json").read_text())]  # fmt: skip
    chosen = [selection_of(items, g) for g in groups]
    wanted = {nodeid for c in chosen for nodeid in c}
    only = folder / "only.json"
    if only.exists():  # the tests whose outcome no earlier run recorded
        wanted &= set(json.loads(only.read_text()))
    kept = [item for item in items if item.nodeid in wanted]
    dropped = [item for item in items if item.nodeid not in wanted]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
    worker = getattr(config, "workerinput", {}).get("workerid", "main")
    (folder / f"selection-{worker}.json").write_text(json.dumps(chosen))


_OUTCOMES: dict[str, str] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """A test passed only if its set-up, call and teardown did (in the controller, too)."""
    if _folder() is None:
        return
    if report.failed:
        _OUTCOMES[report.nodeid] = "failed"
    elif report.when == "call" and _OUTCOMES.get(report.nodeid) != "failed":
        _OUTCOMES[report.nodeid] = "skipped" if report.skipped else "passed"
    elif report.skipped and report.nodeid not in _OUTCOMES:
        _OUTCOMES[report.nodeid] = "skipped"


def pytest_sessionfinish(session: pytest.Session) -> None:
    folder = _folder()
    if folder is None or hasattr(session.config, "workerinput"):
        return  # an xdist worker: its reports reach the controller, which writes them
    # Whole or not at all: the mutation check may be watching for this file.
    partial = folder / "outcomes.json.partial"
    partial.write_text(json.dumps(_OUTCOMES))
    partial.replace(folder / "outcomes.json")
