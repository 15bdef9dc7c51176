"""The mutation check: apply each named mutant to a repo copy and run the tests that must kill it.

Mutants live in ``tests/mutants/*.toml``, one table per mutant::

    [[mutant]]
    name = "pg-marker-check-skipped"        # unique, kebab-case
    file = "sinks/postgres/sink.py"         # relative to the repo root
    find = "if start.marker is not None:"   # must occur exactly once in the file
    replace = "if False:"
    kill = ["tests/integration/test_postgres_sink.py"]   # pytest arguments (files or node ids)
    why = "the marker check is what makes a replayed epoch a no-op (I1)"

A mutant is killed when its tests fail (pytest exit code 1) or time out. The
tests are first run once, unmutated, on the same copy: a kill only counts if
those tests pass without the mutant. A mutant whose ``find`` text no longer
occurs exactly once is *stale* and fails the run, like a survivor, so the
list is kept in step with the code.

Why a short script and not mutmut or cosmic-ray: those generate random
operator mutants over whole modules, which on this suite (real Postgres,
Spark) would take hours; the check here is a fixed list of mutants that each
break one named invariant, with the tests that claim to guard it.

Usage::

    python -m tests.mutation [--only NAME ...] [--sample N --seed S] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MUTANTS_DIR = REPO / "tests" / "mutants"
_NAME = re.compile(r"[a-z0-9]+(-[a-z0-9]+)*")


@dataclass(frozen=True)
class Mutant:
    """One small patch to the engine and the tests that must notice it."""

    name: str
    file: str
    find: str
    replace: str
    kill: tuple[str, ...]
    why: str
    source: str  # the .toml file it came from
    marker: str = ""  # optional pytest -m expression for its kill tests


@dataclass
class Outcome:
    mutant: Mutant
    status: str  # killed | survived | stale | timeout
    seconds: float
    detail: str = ""
    killers: list[str] = field(default_factory=list)


def load_mutants(directory: Path = MUTANTS_DIR) -> list[Mutant]:
    """Every mutant of every ``*.toml`` file in ``directory``, validated.

    Raises:
        ValueError: a malformed entry or a duplicate name (naming the file).
    """
    mutants: list[Mutant] = []
    seen: dict[str, str] = {}
    for path in sorted(directory.glob("*.toml")):
        data = tomllib.loads(path.read_text())
        for entry in data.get("mutant", []):
            required = ("name", "file", "find", "replace", "kill", "why")
            missing = [k for k in required if k not in entry]
            if missing:
                raise ValueError(f"{path.name}: mutant {entry.get('name')!r} lacks {missing}")
            name = entry["name"]
            if not _NAME.fullmatch(name):
                raise ValueError(f"{path.name}: mutant name {name!r} must be kebab-case")
            if name in seen:
                raise ValueError(f"mutant {name!r} is defined in both {seen[name]} and {path.name}")
            seen[name] = path.name
            if entry["find"] == entry["replace"]:
                raise ValueError(f"{path.name}: mutant {name!r} changes nothing")
            mutants.append(
                Mutant(
                    name=name,
                    file=entry["file"],
                    find=entry["find"],
                    replace=entry["replace"],
                    kill=tuple(entry["kill"]),
                    why=entry["why"],
                    source=path.name,
                    marker=entry.get("marker", ""),
                )
            )
    return mutants


def _copy_repo(target: Path) -> None:
    """Copy tracked and untracked-but-not-ignored files (CI's clone, plus local work)."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for raw in listed:
        if not raw:
            continue
        rel = raw.decode()
        source = REPO / rel
        if not source.is_file():
            continue  # deleted in the work tree
        dest = target / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, dest)


def _pytest(copy: Path, args: list[str], marker: str, timeout: float) -> tuple[int | None, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(copy)
    env["PYSPARK_PYTHON"] = sys.executable
    env.pop("PYTEST_ADDOPTS", None)
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "--no-header"]
    if marker:
        cmd += ["-m", marker]
    try:
        done = subprocess.run(
            [*cmd, *args], cwd=copy, env=env, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout:.0f}s"
    return done.returncode, done.stdout[-4000:] + done.stderr[-2000:]


def _killers(output: str) -> list[str]:
    return re.findall(r"^(?:FAILED|ERROR) (\S+)", output, re.MULTILINE)


def run(mutants: list[Mutant], *, timeout: float, log: bool = True) -> list[Outcome]:
    """Run every mutant against its kill tests, on one copy of the repo."""
    outcomes: list[Outcome] = []
    with tempfile.TemporaryDirectory(prefix="reconcile-mutants-") as tmp:
        copy = Path(tmp) / "repo"
        _copy_repo(copy)
        # Baseline: every kill set must pass unmutated, or a "kill" means nothing.
        groups: dict[tuple[tuple[str, ...], str], list[Mutant]] = {}
        for m in mutants:
            groups.setdefault((m.kill, m.marker), []).append(m)
        for (kill, marker), members in groups.items():
            start = time.monotonic()
            code, output = _pytest(copy, list(kill), marker, timeout)
            if code != 0:
                names = ", ".join(m.name for m in members)
                raise SystemExit(
                    f"mutation check: the kill tests {list(kill)} fail WITHOUT a mutant "
                    f"(exit {code}); fix them before checking mutants [{names}]\n{output}"
                )
            if log:
                took = time.monotonic() - start
                print(f"baseline ok ({took:.0f}s): {' '.join(kill)}", flush=True)
        for m in mutants:
            target = copy / m.file
            original = target.read_text()
            count = original.count(m.find)
            if count != 1:
                outcomes.append(
                    Outcome(m, "stale", 0.0, f"`find` occurs {count} times in {m.file}")
                )
                if log:
                    print(f"STALE    {m.name}: find text occurs {count} times in {m.file}")
                continue
            target.write_text(original.replace(m.find, m.replace))
            start = time.monotonic()
            try:
                code, output = _pytest(copy, list(m.kill), m.marker, timeout)
            finally:
                target.write_text(original)
            seconds = time.monotonic() - start
            if code is None:
                outcome = Outcome(m, "timeout", seconds, output)
            elif code == 1:
                outcome = Outcome(m, "killed", seconds, killers=_killers(output))
            else:
                outcome = Outcome(m, "survived", seconds, f"pytest exit {code}\n{output}")
            outcomes.append(outcome)
            if log:
                shown = outcome.killers[0] if outcome.killers else outcome.detail.splitlines()[:1]
                print(f"{outcome.status.upper():8} {m.name} ({seconds:.0f}s) {shown}", flush=True)
    return outcomes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=None, help="run only these mutants")
    parser.add_argument("--sample", type=int, default=0, help="run N mutants chosen by --seed")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per pytest run")
    parser.add_argument("--json", type=Path, default=None, help="write the report here")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    args = parser.parse_args(argv)
    mutants = load_mutants()
    if args.list:
        for m in mutants:
            print(f"{m.name:45} {m.file}  ({m.source}) {m.why}")
        return 0
    if args.only is not None:
        unknown = sorted(set(args.only) - {m.name for m in mutants})
        if unknown:
            print(f"mutation check: unknown mutants {unknown}", file=sys.stderr)
            return 2
        mutants = [m for m in mutants if m.name in args.only]
    if args.sample and args.sample < len(mutants):
        chosen = random.Random(args.seed).sample(mutants, args.sample)
        mutants = sorted(chosen, key=lambda m: m.name)
    outcomes = run(mutants, timeout=args.timeout)
    bad = [o for o in outcomes if o.status in ("survived", "stale")]
    print(
        f"mutation check: {len(outcomes)} mutants, "
        f"{sum(o.status in ('killed', 'timeout') for o in outcomes)} killed, "
        f"{sum(o.status == 'survived' for o in outcomes)} survived, "
        f"{sum(o.status == 'stale' for o in outcomes)} stale"
    )
    for o in bad:
        print(f"  {o.status}: {o.mutant.name} ({o.mutant.source}): {o.mutant.why}\n{o.detail}")
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                [
                    {
                        "name": o.mutant.name,
                        "status": o.status,
                        "seconds": round(o.seconds, 1),
                        "killers": o.killers,
                        "why": o.mutant.why,
                    }
                    for o in outcomes
                ],
                indent=2,
            )
        )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
