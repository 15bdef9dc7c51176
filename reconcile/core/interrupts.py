"""SIGINT and SIGTERM: stop at once, say what was interrupted and what it left written.

The command line installs a :class:`Guard` for the length of a command. Its
handler raises :class:`Interrupted` in the main thread, wherever that thread
is: waiting for a statement that runs in a worker (``sinks.postgres.heavy``),
inside psycopg's wait for a reply, in a sleep between two rounds of
``watch``. ``Interrupted`` is a ``KeyboardInterrupt``, so that what already
treats Ctrl-C as "cancel and get out" does the same for SIGTERM: psycopg
cancels the statement it waits for on the server before it re-raises, and no
``except Exception`` takes it for an error to report and carry on after.

What the one line says comes from two records kept while the command runs:

- the steps it is in (:func:`step`): "the pull" of a table inside "round 3",
  captured when the signal arrives;
- what it has written (:func:`commit_point`): nothing until a COMMIT is sent;
  from then on the outcome of that COMMIT is in doubt until its reply is read
  (the line then says so and how to check, never "nothing was written"). A
  command that commits as it goes elsewhere says what stands (:func:`writing`).

An exception can be lost on its way up: a native library that runs Python
callbacks may swallow it, which is how Ctrl-C once let a repair go on to
commit. So the guard also remembers the signal, and :func:`check` raises it
again; the repair calls it right before its COMMIT, the recovery engine
between its steps.

A signal that was ignored when the command started (a shell starts a
script's background jobs with SIGINT ignored) stays ignored, as coreutils and
Python itself leave it. A second signal while the first one's clean-up runs
(cancels, rollbacks; bounded, a few seconds at most) ends the process at once
by that signal, for an operator who will not wait.
"""

from __future__ import annotations

import enum
import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from types import FrameType
from typing import Any

__all__ = [
    "SIGNALS",
    "CommitPoint",
    "Guard",
    "Interrupted",
    "Step",
    "Written",
    "active",
    "check",
    "commit_point",
    "interrupted",
    "name_table",
    "reinstall",
    "step",
    "stopping",
    "writing",
]

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Written(enum.Enum):
    """What a command had written when it was interrupted."""

    NOTHING = "nothing"  # no COMMIT was sent
    WRITTEN = "written"  # a COMMIT was sent and succeeded
    IN_DOUBT = "in doubt"  # a COMMIT was sent and its reply was not read
    # A command that commits as it goes, in processes or statements of its own
    # (the demo's pipeline, settling prepared transactions): what stands is
    # said in the command's own words.
    AS_IT_WENT = "as it went"


@dataclass
class Step:
    """One step a command is in; ``table`` names the table of the steps inside it too."""

    what: str
    table: str | None = None


_STEPS: ContextVar[tuple[Step, ...]] = ContextVar("reconcile_interrupt_steps", default=())


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM stopped the command; what it was doing and what it had written.

    Args:
        signum: the signal.
        steps: the steps the command was in, outermost first.
        written: what it had written by then.
        commit: what the last COMMIT sent was for (``the repair of public.orders``);
            for ``Written.AS_IT_WENT``, what stands of the command's writes.
    """

    def __init__(
        self,
        signum: int,
        steps: tuple[Step, ...] = (),
        written: Written = Written.NOTHING,
        commit: str | None = None,
    ) -> None:
        super().__init__(signum, steps, written, commit)
        self.signum = signum
        self.steps = steps
        self.written = written
        self.commit = commit

    def __str__(self) -> str:
        return self.signal_name

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        """128 + the signal's number, as a shell reports a process the signal ended: 130, 143."""
        return 128 + self.signum

    def where(self) -> str:
        """``during the pull of public.orders, in round 3``; empty outside every step."""
        if not self.steps:
            return ""
        inner = self.steps[-1]
        table = next((s.table for s in reversed(self.steps) if s.table), None)
        text = f" during {inner.what}" + (f" of {table}" if table else "")
        # The steps outside the table's (a round of watch) say which one.
        first_table = next((i for i, s in enumerate(self.steps) if s.table), len(self.steps) - 1)
        outer = [s.what for s in self.steps[: min(first_table, len(self.steps) - 1)]]
        return text + "".join(f", in {what}" for what in reversed(outer))

    def outcome(self) -> str:
        """What it had written, and what to do about it."""
        if self.written is Written.NOTHING:
            return "nothing was written"
        if self.written is Written.WRITTEN:
            return f"{self.commit} had been committed; nothing else was written"
        if self.written is Written.AS_IT_WENT:
            return str(self.commit)
        return (
            f"the COMMIT of {self.commit} had been sent, so whether it was written is unknown: "
            "run `reconcile verify` to see"
        )

    def line(self, command: str) -> str:
        """The one line on stderr: ``reconcile repair: interrupted by SIGINT during ...; ...``."""
        return f"{command}: interrupted by {self.signal_name}{self.where()}; {self.outcome()}"


class CommitPoint:
    """A COMMIT on its way: in doubt once sent, until the caller says how it ended."""

    def __init__(self, guard: Guard | None, what: str) -> None:
        self.guard, self.what = guard, what
        self._before = (Written.NOTHING, None) if guard is None else (guard.written, guard.commit)

    def committed(self) -> None:
        """Its reply said it took effect."""
        if self.guard is not None:
            self.guard.written, self.guard.commit = Written.WRITTEN, self.what

    def aborted(self) -> None:
        """It is known not to have taken effect: what was written before stands."""
        if self.guard is not None:
            self.guard.written, self.guard.commit = self._before


class Guard:
    """SIGINT and SIGTERM handlers for one command; what it has written so far.

    ``install()`` replaces the handlers (in the main thread only: signals reach
    no other) and ``restore()`` puts the previous ones back.
    """

    def __init__(self) -> None:
        self.signum: int | None = None
        self.written = Written.NOTHING
        self.commit: str | None = None
        self._previous: dict[int, Any] = {}
        self._outer: Guard | None = None
        self._stop: threading.Event | None = None

    def install(self) -> Guard:
        global _GUARD
        if threading.current_thread() is not threading.main_thread():
            return self
        # The guard first: a signal that arrives while the handlers go in finds it.
        self._outer, _GUARD = _GUARD, self
        for signum in SIGNALS:
            current = signal.getsignal(signum)
            if current == signal.SIG_IGN:
                continue  # ignored by whoever started us: left ignored
            self._previous[signum] = current
            signal.signal(signum, _on_signal)
        return self

    def restore(self) -> None:
        global _GUARD
        for signum, handler in self._previous.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
        self._previous.clear()
        if _GUARD is self:
            _GUARD = self._outer

    def __enter__(self) -> Guard:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.restore()

    def interrupted(self, signum: int) -> Interrupted:
        """The exception for ``signum``, with the steps the command is in now."""
        steps = tuple(Step(s.what, s.table) for s in _STEPS.get())
        return Interrupted(signum, steps, self.written, self.commit)

    @property
    def signal_name(self) -> str | None:
        return None if self.signum is None else signal.Signals(self.signum).name


_GUARD: Guard | None = None


def _on_signal(signum: int, frame: FrameType | None) -> None:
    guard = _GUARD
    if guard is None:  # restored meanwhile: behave as the default would
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    if guard.signum is not None:
        # A second signal: the operator will not wait for the first one's
        # clean-up. The database rolls back what was not committed, and the
        # server ends our statements by its client checks.
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    guard.signum = signum
    if guard._stop is not None:
        guard._stop.set()  # a graceful stop: the caller winds down
        return
    raise guard.interrupted(signum)


def active() -> Guard | None:
    """The guard installed now, if any."""
    return _GUARD


def reinstall() -> None:
    """Install the guard's handlers again, over those a library put in (PySpark's for SIGINT)."""
    guard = _GUARD
    if guard is None or threading.current_thread() is not threading.main_thread():
        return
    for signum in guard._previous:
        signal.signal(signum, _on_signal)


def check() -> None:
    """Raise the interruption already received, if its exception was lost on the way up."""
    guard = _GUARD
    if guard is not None and guard.signum is not None and guard._stop is None:
        raise guard.interrupted(guard.signum)


def interrupted(exc: KeyboardInterrupt) -> Interrupted:
    """``exc`` as an :class:`Interrupted`: a plain KeyboardInterrupt is a SIGINT."""
    if isinstance(exc, Interrupted):
        return exc
    guard = _GUARD
    if guard is None:
        return Interrupted(signal.SIGINT)
    return Interrupted(guard.signum or signal.SIGINT, (), guard.written, guard.commit)


@contextmanager
def step(what: str, *, table: str | None = None) -> Iterator[Step]:
    """The command is in ``what`` (of ``table``) for the block: an interruption names it."""
    current = Step(what, table)
    token = _STEPS.set((*_STEPS.get(), current))
    try:
        yield current
    finally:
        _STEPS.reset(token)


def name_table(table: str) -> None:
    """The table of the innermost step that names one is ``table`` (its full name, once known)."""
    for current in reversed(_STEPS.get()):
        if current.table is not None:
            current.table = table
            return


def writing(what_stands: str) -> None:
    """The command commits as it goes; an interruption says ``what_stands`` about its writes."""
    guard = _GUARD
    if guard is not None:
        guard.written, guard.commit = Written.AS_IT_WENT, what_stands


def commit_point(what: str) -> CommitPoint:
    """A COMMIT of ``what`` is about to be sent: from now on its outcome is in doubt.

    The caller calls ``committed()`` or ``aborted()`` on the result once it knows.
    """
    guard = _GUARD
    point = CommitPoint(guard, what)
    if guard is not None:
        guard.written, guard.commit = Written.IN_DOUBT, what
    return point


@contextmanager
def stopping(event: threading.Event) -> Iterator[Guard]:
    """For the block, SIGINT and SIGTERM set ``event`` instead of raising: a graceful stop.

    The guard it yields says which signal stopped it (``signal_name``). Outside
    a command's guard it installs one of its own for the block.
    """
    guard = _GUARD
    own = None
    if guard is None:
        own = guard = Guard().install()
    before, guard._stop = guard._stop, event
    try:
        yield guard
    finally:
        guard._stop = before
        if own is not None:
            own.restore()
