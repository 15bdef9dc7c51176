"""Running pytest for the mutation check: repo copies, one kill set's run, the joint baseline.

Every run is a process group of its own (pytest, and the Spark JVMs and server
clients it starts), so that a timeout or a failed baseline stops all of it.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tests import mutation_baseline

__all__ = [
    "BaselineFailed",
    "GroupKey",
    "Runs",
    "copy_repo",
    "joint_baseline",
    "killers",
    "plain_groups",
    "run_pytest",
]

REPO = Path(__file__).resolve().parents[1]
# How long the check waits for the next run beside it to end: CI's slowest step, and more.
WAIT_LIMIT_S = 3 * 3600.0


def copy_repo(target: Path) -> None:
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


class Runs:
    """The pytest runs under way, so that a failed baseline can stop them all at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._procs: set[subprocess.Popen[str]] = set()
        self.stopped = False

    def add(self, proc: subprocess.Popen[str]) -> bool:
        with self._lock:
            if self.stopped:
                return False
            self._procs.add(proc)
            return True

    def remove(self, proc: subprocess.Popen[str]) -> None:
        with self._lock:
            self._procs.discard(proc)

    def stop_all(self) -> None:
        with self._lock:
            self.stopped = True
            for proc in self._procs:
                _kill_group(proc)


def _kill_group(proc: subprocess.Popen[str]) -> None:
    # The whole session: pytest, and the Spark JVMs and servers' clients it started.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def run_pytest(
    copy: Path,
    args: list[str],
    marker: str,
    timeout: float,
    runs: Runs,
    *,
    workers: int = 0,
    baseline: Path | None = None,
) -> tuple[int | None, str]:
    """One pytest run on ``copy``: its exit code (None: timed out or stopped) and output's end.

    ``workers`` > 0 runs it with that many xdist workers and without ``-x``;
    ``baseline`` loads the baseline plugin, which records into that folder.
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = str(copy)
    env["PYSPARK_PYTHON"] = sys.executable
    env.pop("PYTEST_ADDOPTS", None)
    # A temp folder of this copy's own: pytest empties its basetemp at each start,
    # and two copies' runs must not clean up each other's.
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--no-header",
           f"--basetemp={copy.parent / (copy.name + '-tmp')}"]  # fmt: skip
    if workers:
        cmd += ["-n", str(workers), "--dist", "worksteal"]
    else:
        # One mutant's run: stop at the first failure. Hypothesis' pytest plugin
        # only reports (the tests import hypothesis themselves), and loading it
        # cost half of each run's start, 300 times over.
        cmd += ["-x", "-p", "no:xdist", "-p", "no:hypothesispytest"]
    if baseline is not None:
        env[mutation_baseline.ENV] = str(baseline)
        cmd += ["-p", "tests.mutation_baseline"]
    if marker:
        cmd += ["-m", marker]
    proc = subprocess.Popen(
        [*cmd, *args], cwd=copy, env=env, text=True, start_new_session=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    if not runs.add(proc):
        _kill_group(proc)
        proc.communicate()
        return None, "stopped: another run failed"
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        proc.communicate()
        return None, f"timed out after {timeout:.0f}s"
    finally:
        runs.remove(proc)
    return proc.returncode, stdout[-4000:] + stderr[-2000:]


def killers(output: str) -> list[str]:
    return re.findall(r"^(?:FAILED|ERROR) (\S+)", output, re.MULTILINE)


class BaselineFailed(Exception):
    """A kill set fails without any mutant: its kills would mean nothing."""


GroupKey = tuple[tuple[str, ...], str]


def plain_groups(
    groups: Mapping[GroupKey, object],
) -> dict[GroupKey, mutation_baseline.Selection]:
    """The kill sets that can share the joint baseline run (none if pytest's matchers moved)."""
    if not mutation_baseline.available():
        return {}
    parsed = {key: mutation_baseline.parse(key[0], key[1]) for key in groups}
    return {key: sel for key, sel in parsed.items() if sel is not None}


def baseline_problems(
    keys: Sequence[GroupKey], chosen: Sequence[Sequence[str]], outcomes: Mapping[str, str]
) -> list[str]:
    """Why each failing kill set fails its baseline: it selects no test, or one did not pass.

    A test without an outcome (the run was cut short before it) did not pass.
    """
    problems = []
    for (kill, marker), selected in zip(keys, chosen, strict=True):
        bad = [n for n in selected if outcomes.get(n) not in ("passed", "skipped")]
        if not selected:
            problems.append(f"{list(kill)} (marker {marker!r}) selects no test")
        elif bad:
            problems.append(f"{list(kill)}: {', '.join(bad[:5])} did not pass")
    return problems


def finished(folder: Path) -> bool:
    """Whether the run that records into ``folder`` has ended (its outcomes, or ``done``)."""
    return (folder / "outcomes.json").exists() or (folder / "done").exists()


def joint_baseline(
    copies: queue.Queue[Path],
    together: dict[GroupKey, mutation_baseline.Selection],
    timeout: float,
    jobs: int,
    runs: Runs,
    release: Callable[[list[GroupKey]], None],
    *,
    folders: Sequence[Path] = (),
    log: bool,
) -> None:
    """Pass every kill set of ``together`` through its baseline; ``release`` each one that passed.

    ``folders`` are where other runs of the same code record each test's
    outcome (CI's default and slow runs, side by side with this check). The
    kill sets' selection is collected first; a kill set whose tests those runs
    all passed is released as soon as they end, so its mutants run while the
    other run goes on. Once every run has ended, the tests no run covered run
    here, at once, in one xdist run. Without ``folders``, that run is all.

    Raises:
        BaselineFailed: a kill set selects no test, one of its tests did not
            pass, or a run never ended (within ``WAIT_LIMIT_S`` of the one before).
    """
    keys = list(together)
    selections = list(together.values())
    roots = mutation_baseline.root_paths(selections)
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="reconcile-baseline-") as tmp:
        folder = Path(tmp)
        (folder / "groups.json").write_text(json.dumps([s.as_json() for s in selections]))

        def pytest_on_a_copy(args: list[str], **options: Any) -> tuple[int | None, str]:
            copy = copies.get()
            try:
                return run_pytest(copy, args, "", timeout, runs, baseline=folder, **options)
            finally:
                copies.put(copy)

        code, output = pytest_on_a_copy(["--collect-only", *roots])
        if code != 0:
            raise BaselineFailed(f"mutation check: collecting the kill sets failed\n{output}")
        chosen = mutation_baseline.selected(selections, folder)
        output = ""  # the collection's list of tests: no help in a failure's message
        for stale in folder.glob("selection-*.json"):
            stale.unlink()
        pending = dict(enumerate(keys))
        seen: set[Path] = set()
        outcomes: dict[str, str] = {}

        def settle(last: bool) -> None:
            ready = [i for i in pending if last or all(n in outcomes for n in chosen[i])]
            problems = baseline_problems([pending[i] for i in ready], [chosen[i] for i in ready],
                                         outcomes)  # fmt: skip
            if problems:
                raise BaselineFailed(
                    "mutation check: kill tests fail WITHOUT a mutant; fix them before "
                    "checking mutants:\n  " + "\n  ".join(problems) + f"\n{output}"
                )
            if ready:
                release([pending.pop(i) for i in ready])

        waited = time.monotonic()
        while len(seen) < len(folders):
            if runs.stopped:
                return
            ended = [f for f in folders if f not in seen and finished(f)]
            if not ended:
                if time.monotonic() - waited > WAIT_LIMIT_S:
                    raise BaselineFailed(
                        f"mutation check: the runs recording into {sorted(set(folders) - seen)} "
                        "never ended"
                    )
                time.sleep(2)
                continue
            seen.update(ended)
            outcomes = mutation_baseline.recorded(seen)
            settle(last=False)
            waited = time.monotonic()
        missing = sorted({n for i in pending for n in chosen[i]} - outcomes.keys())
        ran = len(missing)
        if missing:
            # The rest at once: more time than one kill set's run, the cores kept
            # busy by more workers than mutant runs (they mostly wait).
            (folder / "only.json").write_text(json.dumps(missing))
            code, output = pytest_on_a_copy(roots, workers=jobs + 1)
            if code is None:
                raise BaselineFailed(f"mutation check: the joint baseline run {output}")
            outcomes.update(mutation_baseline.recorded([folder]))
        settle(last=True)
    if log:
        tests = len({n for c in chosen for n in c})
        took = time.monotonic() - start
        beside = f", {tests - ran} recorded by the runs beside" if folders else ""
        print(f"baseline ok ({took:.0f}s): {len(keys)} kill sets, {tests} tests, {ran} run here"
              f"{beside}", flush=True)  # fmt: skip
