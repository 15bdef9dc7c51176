"""Named points inside race windows, where a test runs the other party (a takeover, a writer).

A race is tested by putting the other party exactly inside the window, not by
sleeping. Engine code marks a window with ``point(NAME)``; a test arms the
point with ``at(NAME, action)``, and ``action`` runs right there, in the
engine's thread, before the engine goes on. The names are declared once by the
module that owns the window (``declare``), so a test cannot arm a point that
does not exist, and a mutant that deletes a point makes its test fail (the
action never ran, and the test asserts that it did).

A subprocess can also be told to die by SIGKILL at a point, for real-crash
tests: ``RECONCILE_KILL_AT=<point>[:<nth>]`` in its environment. Processes
that inherit it (Spark's Python workers) would each die there; with
``RECONCILE_KILL_ONCE=<file>`` too, only the first process to create that file
dies, and the file, holding its pid and the point, shows that the kill fired.
With ``RECONCILE_KILL_GATE=<file>``, hits count only once that file exists:
a harness opens the gate when the moment suits it (a standby is ready), and
the process dies at the nth hit after that.

A subprocess can be held at a point instead, for interrupt tests:
``RECONCILE_HOLD_AT=<point>[:<nth>]`` with ``RECONCILE_HOLD_FILE=<file>``.
At the nth hit the process writes its pid and the point into that file and
sleeps there (``HOLD_S`` at most), so that a test sends its signal exactly
there; the signal's exception leaves the point as it would leave any code.
``RECONCILE_HOLD_SWALLOW=1`` makes the hold swallow that exception and go on,
as a native library that runs Python callbacks may: what still stops the
process is then the engine's own record of the signal.

An unarmed point costs one dictionary lookup.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

__all__ = ["HOLD_S", "Arming", "at", "declare", "declared", "point"]

_DECLARED: set[str] = set()
_ARMED: dict[str, Arming] = {}
_LOCK = threading.Lock()


@dataclass
class Arming:
    """One armed point: what runs there, on which hits, and how often it ran."""

    name: str
    action: Callable[[], None]
    nth: int = 1  # the first hit (1-based) on which the action runs
    times: int = 1  # how many consecutive hits run it
    hits: int = 0
    fired: int = 0


def declare(name: str) -> str:
    """Declare a window point owned by the calling module; returns ``name``."""
    _DECLARED.add(name)
    return name


def declared() -> frozenset[str]:
    """Every point declared by the modules imported so far."""
    return frozenset(_DECLARED)


def _point_spec(variable: str) -> tuple[str, int] | None:
    raw = os.environ.get(variable)
    if not raw:
        return None
    name, _, nth = raw.partition(":")
    return name, int(nth or "1")


_KILL_AT = _point_spec("RECONCILE_KILL_AT")
_KILL_HITS: dict[str, int] = {}
_HOLD_AT = _point_spec("RECONCILE_HOLD_AT")
_HOLD_HITS: dict[str, int] = {}
# How long a held process waits for its signal before it goes on (the test
# that held it has failed by then).
HOLD_S = 60.0


def _first_to_die(name: str) -> bool:
    """Whether this process is the one to die (always, unless RECONCILE_KILL_ONCE names a file)."""
    once = os.environ.get("RECONCILE_KILL_ONCE")
    if not once:
        return True
    try:
        fd = os.open(once, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as out:
        out.write(f"{os.getpid()} {name}\n")
        out.flush()
        os.fsync(out.fileno())
    return True


def _gate_open() -> bool:
    gate = os.environ.get("RECONCILE_KILL_GATE")
    return not gate or os.path.exists(gate)


def _hold(name: str) -> None:
    """Announce the hold in RECONCILE_HOLD_FILE, then wait here for a signal."""
    announce = os.environ.get("RECONCILE_HOLD_FILE")
    if announce:
        partial = f"{announce}.partial"
        with open(partial, "w") as out:
            out.write(f"{os.getpid()} {name}\n")
        os.replace(partial, announce)  # whole or absent for the test that polls it
    deadline = time.monotonic() + HOLD_S
    try:
        while time.monotonic() < deadline:
            time.sleep(0.05)
    except KeyboardInterrupt:
        if os.environ.get("RECONCILE_HOLD_SWALLOW") != "1":
            raise


def point(name: str) -> None:
    """Mark a window: run the action armed here, if any (never re-entered)."""
    if _KILL_AT is not None and _KILL_AT[0] == name and _gate_open():
        _KILL_HITS[name] = _KILL_HITS.get(name, 0) + 1
        if _KILL_HITS[name] == _KILL_AT[1] and _first_to_die(name):
            os.kill(os.getpid(), signal.SIGKILL)
    if _HOLD_AT is not None and _HOLD_AT[0] == name:
        _HOLD_HITS[name] = _HOLD_HITS.get(name, 0) + 1
        if _HOLD_HITS[name] == _HOLD_AT[1]:
            _hold(name)
    arming = _ARMED.get(name)
    if arming is None:
        return
    with _LOCK:
        arming.hits += 1
        due = arming.nth <= arming.hits < arming.nth + arming.times
        if due:
            arming.fired += 1
            # Disarmed while the action runs: the other party may pass the same point.
            del _ARMED[name]
    if due:
        try:
            arming.action()
        finally:
            with _LOCK:
                if arming.fired < arming.times:
                    _ARMED[name] = arming


@contextmanager
def at(name: str, action: Callable[[], None], *, nth: int = 1, times: int = 1) -> Iterator[Arming]:
    """Arm ``name`` for the duration of the block; yields the arming (check ``fired``).

    Raises:
        KeyError: ``name`` is not a declared point (import its module first).
        RuntimeError: the point is armed already.
    """
    if name not in _DECLARED:
        raise KeyError(f"no hook point {name!r}; declared: {sorted(_DECLARED)}")
    arming = Arming(name, action, nth=nth, times=times)
    with _LOCK:
        if name in _ARMED:
            raise RuntimeError(f"hook point {name!r} is armed already")
        _ARMED[name] = arming
    try:
        yield arming
    finally:
        with _LOCK:
            _ARMED.pop(name, None)
