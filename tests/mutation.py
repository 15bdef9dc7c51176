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
tests are first run once, unmutated, on a copy with the same content: a kill
only counts if those tests pass without the mutant (mutants that share their
kill tests share that run). ``--jobs`` runs go side by side, each on a repo
copy and a pytest temp folder of its own; a mutant is undone before its copy
is used again. A mutant whose ``find`` text no longer
occurs exactly once is *stale* and fails the run, like a survivor, so the
list is kept in step with the code.

Why a short script and not mutmut or cosmic-ray: those generate random
operator mutants over whole modules, which on this suite (real Postgres,
Spark) would take hours; the check here is a fixed list of mutants that each
break one named invariant, with the tests that claim to guard it.

With ``RECONCILE_MUTATION_SAMPLE=SEED[:SHARE]`` (CI sets it, the seed from
the commit) a share of the mutants runs (a third when none is given), each
drawn on its own by the seed and its name, so successive commits run them all
and one mutant's draw does not change when others are added; the same value
repeats the draw. Every mutant, drawn or not, is still checked for staleness.
The slow tier (``tests/fix_tiers.py``) keeps the tests the drawn mutants claim.

Usage::

    python -m tests.mutation [--only NAME ...] [--sample N --seed S] [--jobs N] [--json OUT]
                             [--outcomes DIR ...]
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import json
import math
import os
import queue
import random
import re
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.mutation_runs import (
    BaselineFailed,
    GroupKey,
    Runs,
    copy_repo,
    joint_baseline,
    killers,
    plain_groups,
    run_pytest,
)

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


SAMPLE_ENV = "RECONCILE_MUTATION_SAMPLE"  # SEED[:SHARE]: run a seeded share of the mutants
SHARE = 1 / 3


def drawn(mutants: list[Mutant], value: str) -> list[Mutant]:
    """The mutants a ``SEED[:SHARE]`` draw runs (all of them for an empty value).

    Raises:
        ValueError: an empty seed, or a share that is not a number in (0, 1].
    """
    if not value:
        return mutants
    seed, _, share_text = value.partition(":")
    try:
        share = float(share_text) if share_text else SHARE
    except ValueError:
        share = math.nan
    if not seed or not 0 < share <= 1:
        raise ValueError(f"{SAMPLE_ENV}={value!r}: expected SEED or SEED:SHARE, 0 < SHARE <= 1")
    return [m for m in mutants if random.Random(f"{seed}:{m.name}").random() < share]


def _stale(m: Mutant) -> str:
    """Why ``m`` no longer applies to the repo, or "" when its ``find`` occurs exactly once."""
    path = REPO / m.file
    count = path.read_text().count(m.find) if path.exists() else 0
    return "" if count == 1 else f"`find` occurs {count} times in {m.file}"


def _heavy(kill: tuple[str, ...]) -> bool:
    """Whether a kill set likely starts Spark or a whole pipeline (minutes, not seconds)."""
    return any(word in arg for arg in kill for word in ("spark", "stream", "demo", "cli_run"))


def run(
    mutants: list[Mutant],
    *,
    timeout: float,
    jobs: int = 1,
    log: bool = True,
    outcome_folders: list[Path] | None = None,
) -> list[Outcome]:
    """Run every mutant against its kill tests, ``jobs`` at a time, each on a repo copy of its own.

    Each distinct kill set (tests and marker) runs once unmutated first, on a
    copy with the same content as the one its mutants will run on (each
    mutant is undone before its copy is used again); its mutants start once
    it has passed. Outcomes come back in the order of ``mutants``.

    Raises:
        SystemExit: a kill set fails without a mutant (the other runs are stopped).
    """
    outcomes: dict[str, Outcome] = {}
    live: list[Mutant] = []
    for m in mutants:
        reason = _stale(m)
        if reason:
            outcomes[m.name] = Outcome(m, "stale", 0.0, reason)
            if log:
                print(f"STALE    {m.name}: {reason}", flush=True)
        else:
            live.append(m)
    groups: dict[GroupKey, list[Mutant]] = {}
    for m in live:
        groups.setdefault((m.kill, m.marker), []).append(m)
    jobs = max(1, min(jobs, len(groups) or 1))
    runs = Runs()
    with tempfile.TemporaryDirectory(prefix="reconcile-mutants-") as tmp:
        copies: queue.Queue[Path] = queue.Queue()
        for i in range(jobs):
            copy = Path(tmp) / f"repo{i}"
            copy_repo(copy)
            copies.put(copy)

        def baseline(kill: tuple[str, ...], marker: str, members: list[Mutant]) -> None:
            copy = copies.get()
            try:
                start = time.monotonic()
                code, output = run_pytest(copy, list(kill), marker, timeout, runs)
            finally:
                copies.put(copy)
            if code != 0:
                names = ", ".join(m.name for m in members)
                raise BaselineFailed(
                    f"mutation check: the kill tests {list(kill)} fail WITHOUT a mutant "
                    f"(exit {code}); fix them before checking mutants [{names}]\n{output}"
                )
            if log:
                took = time.monotonic() - start
                print(f"baseline ok ({took:.0f}s): {' '.join(kill)}", flush=True)

        def mutated(m: Mutant) -> Outcome:
            copy = copies.get()
            target = copy / m.file
            original = target.read_text()
            try:
                target.write_text(original.replace(m.find, m.replace))
                start = time.monotonic()
                try:
                    code, output = run_pytest(copy, list(m.kill), m.marker, timeout, runs)
                finally:
                    target.write_text(original)
                seconds = time.monotonic() - start
            finally:
                copies.put(copy)
            if code is None:
                outcome = Outcome(m, "timeout", seconds, output)
            elif code == 1:
                outcome = Outcome(m, "killed", seconds, killers=killers(output))
            else:
                outcome = Outcome(m, "survived", seconds, f"pytest exit {code}\n{output}")
            if log:
                shown = outcome.killers[0] if outcome.killers else outcome.detail.splitlines()[:1]
                print(f"{outcome.status.upper():8} {m.name} ({seconds:.0f}s) {shown}", flush=True)
            return outcome

        ready: collections.deque[Mutant] = collections.deque()
        # The kill sets that are plain selections pass their baseline together,
        # beside the mutant runs (tests/mutation_runs.py: joint_baseline), and
        # are released as they pass.
        together = plain_groups(groups)
        joint_members = {key: groups.pop(key) for key in together}
        released: queue.Queue[list[GroupKey]] = queue.Queue()
        # Kill sets that start Spark or a whole pipeline first, and ready mutants
        # before any further baseline: the last minutes then hold only short runs.
        todo = sorted(groups.items(), key=lambda kv: (not _heavy(kv[0][0]), -len(kv[1])))
        in_flight: dict[concurrent.futures.Future[Any], list[Mutant]] = {}
        failure: BaselineFailed | None = None
        with (
            concurrent.futures.ThreadPoolExecutor(1) as side,
            concurrent.futures.ThreadPoolExecutor(jobs) as pool,
        ):
            joint = None
            if together:
                joint = side.submit(
                    joint_baseline, copies, together, timeout, jobs, runs, released.put,
                    folders=outcome_folders or [], log=log,
                )  # fmt: skip
            while todo or ready or in_flight or joint is not None or not released.empty():
                while not released.empty():
                    for key in released.get():
                        ready.extend(joint_members[key])
                    ready = collections.deque(sorted(ready, key=lambda m: not _heavy(m.kill)))
                if joint is not None and joint.done():
                    error = joint.exception()
                    joint = None
                    if isinstance(error, BaselineFailed):
                        if failure is None:
                            failure = error
                            runs.stop_all()
                    elif error is not None:
                        raise error
                    continue  # what it released last is taken above
                while failure is None and len(in_flight) < jobs and (ready or todo):
                    if ready:
                        m = ready.popleft()
                        in_flight[pool.submit(mutated, m)] = [m]
                    else:
                        (kill, marker), members = todo.pop(0)
                        in_flight[pool.submit(baseline, kill, marker, members)] = members
                if failure is not None:  # what is released from now on is dropped here too
                    todo.clear()
                    ready.clear()
                if not in_flight:
                    time.sleep(1)  # only the joint baseline is under way
                    continue
                done, _ = concurrent.futures.wait(
                    in_flight, timeout=2, return_when=concurrent.futures.FIRST_COMPLETED
                )
                for future in done:
                    members = in_flight.pop(future)
                    try:
                        result = future.result()
                    except BaselineFailed as err:
                        if failure is None:
                            failure = err
                            runs.stop_all()
                        continue
                    if isinstance(result, Outcome):
                        outcomes[result.mutant.name] = result
                    else:  # a baseline passed: its mutants may run
                        ready.extend(members)
        if failure is not None:
            raise SystemExit(str(failure))
    return [outcomes[m.name] for m in mutants]


def default_jobs() -> int:
    """Runs at a time: more than the cores, since the kill tests mostly wait.

    They wait on Spark's JVM starts, servers and subprocesses far more than
    they compute; measured on 2 cores (docs/testing.md), three runs at a time
    finished the whole check fastest. ``RECONCILE_MUTATION_JOBS`` overrides it.
    """
    configured = os.environ.get("RECONCILE_MUTATION_JOBS")
    if configured:
        return max(1, int(configured))
    return (os.cpu_count() or 1) + 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=None, help="run only these mutants")
    parser.add_argument("--sample", type=int, default=0, help="run N mutants chosen by --seed")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per pytest run")
    parser.add_argument(
        "--jobs",
        type=int,
        default=default_jobs(),
        help="pytest runs at a time, each on a repo copy of its own (default: %(default)s)",
    )
    parser.add_argument("--json", type=Path, default=None, help="write the report here")
    parser.add_argument(
        "--outcomes",
        type=Path,
        nargs="*",
        default=[],
        help="folders where earlier runs of this code recorded each test's outcome "
        "(RECONCILE_MUTATION_BASELINE): the baseline runs only the kill tests they lack",
    )
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
    left_out: list[Mutant] = []
    draw = os.environ.get(SAMPLE_ENV, "") if args.only is None else ""
    if draw:
        chosen = drawn(mutants, draw)
        left_out = [m for m in mutants if m not in chosen]
        mutants = chosen
        print(
            f"mutation check sampled ({SAMPLE_ENV}={draw}): {len(mutants)} of "
            f"{len(mutants) + len(left_out)} mutants run; the same value repeats the draw"
        )
    outcomes = run(mutants, timeout=args.timeout, jobs=args.jobs, outcome_folders=args.outcomes)
    # A mutant the draw left out must still apply: a stale one fails every run.
    outcomes += [Outcome(m, "stale", 0.0, why) for m in left_out if (why := _stale(m))]
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
