"""Deterministic, named fault injection for the commit cycle and every sink operation."""

from __future__ import annotations

import enum
import os
import signal
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from reconcile.core.contract import (
    Fatal,
    FatalError,
    Retryable,
    RetryableError,
    SinkOutcome,
    SinkTxnId,
    WriterIdentity,
)
from reconcile.core.sink import SinkCapabilities, bind_writer, capabilities_of

__all__ = [
    "CYCLE_POINTS",
    "SINK_OPERATIONS",
    "Fault",
    "FaultKind",
    "FaultPlan",
    "FaultySink",
    "InjectedFault",
    "SimulatedCrash",
]

# Named failure points. A cycle step is "cycle.<step>"; a sink operation is
# "sink.<sink name>.<operation>".
CYCLE_POINTS = (
    "begin",
    "stage",
    "record_progress",
    "prepare",
    "commit_progress",
    "commit",
    "finalize",
)
SINK_OPERATIONS = ("stage", "prepare", "commit", "abort", "recover")


class FaultKind(enum.Enum):
    """What an injected fault does."""

    EXCEPTION = "exception"  # raise InjectedFault: the caller cannot tell what happened
    RETRYABLE = "retryable"  # the operation reports Retryable and does nothing
    FATAL = "fatal"  # the operation reports Fatal and does nothing
    CRASH = "crash"  # raise SimulatedCrash: the process "dies", in-memory state is lost
    KILL = "kill"  # SIGKILL this very process (for subprocess tests)


class InjectedFault(RuntimeError):
    """An exception raised on purpose by a fault plan (not a ReconcileError: it is foreign)."""


class SimulatedCrash(BaseException):
    """The process "died" here. A BaseException so that no ``except Exception`` catches it."""


@dataclass
class Fault:
    """One fault: at ``point``, on its ``nth`` hit (1-based), do ``kind``.

    ``when="after"`` fires after the operation took effect (a sink operation
    only): an EXCEPTION after a commit is an ambiguous commit, a CRASH after it
    is a crash between commit and acknowledgement.
    """

    point: str
    kind: FaultKind
    nth: int = 1
    when: Literal["before", "after"] = "before"
    times: int = 1  # how many consecutive hits fire, from the nth on
    fired: int = 0

    def __post_init__(self) -> None:
        if self.when == "after" and self.kind in (FaultKind.RETRYABLE, FaultKind.FATAL):
            raise ValueError("an outcome fault cannot fire after the operation took effect")


@dataclass
class FaultPlan:
    """A deterministic list of faults, and a record of which fired.

    ``hit(point)`` is called at every named point; it counts the hits and fires
    the faults whose turn it is.
    """

    faults: list[Fault] = field(default_factory=list)
    hits: dict[str, int] = field(default_factory=dict)
    log: list[str] = field(default_factory=list)
    # Every hit in order, as (point, when, count), when asked for (tests use it
    # to know which fault a run must reach first).
    trace: list[tuple[str, str, int]] | None = None

    def hit(self, point: str, when: Literal["before", "after"] = "before") -> SinkOutcome | None:
        """Count a hit of ``point`` and fire a due fault.

        Returns:
            An outcome to report instead of running the step, or None to run it.

        Raises:
            InjectedFault, SimulatedCrash: for EXCEPTION and CRASH faults.
        """
        if when == "before":
            self.hits[point] = self.hits.get(point, 0) + 1
        count = self.hits.get(point, 0)
        if self.trace is not None:
            self.trace.append((point, when, count))
        for fault in self.faults:
            if fault.point != point or fault.when != when:
                continue
            if not fault.nth <= count < fault.nth + fault.times:
                continue
            fault.fired += 1
            self.log.append(f"{point}#{count}:{fault.kind.value}:{when}")
            return _fire(fault, point)
        return None

    @property
    def all_fired(self) -> bool:
        return all(f.fired >= 1 for f in self.faults)


def _fire(fault: Fault, point: str) -> SinkOutcome | None:
    reason = f"injected {fault.kind.value} at {point} ({fault.when})"
    if fault.kind is FaultKind.EXCEPTION:
        raise InjectedFault(reason)
    if fault.kind is FaultKind.CRASH:
        raise SimulatedCrash(reason)
    if fault.kind is FaultKind.KILL:
        os.kill(os.getpid(), signal.SIGKILL)
    if fault.kind is FaultKind.RETRYABLE:
        return Retryable(reason)
    return Fatal(reason)


class FaultySink:
    """Wraps a sink and consults a FaultPlan around each of its operations."""

    def __init__(self, inner: Any, plan: FaultPlan) -> None:
        self.inner = inner
        self.plan = plan

    @property
    def name(self) -> str:
        return str(self.inner.name)

    @property
    def capabilities(self) -> SinkCapabilities:
        return capabilities_of(self.inner)

    def _call(self, operation: str, *args: Any) -> Any:
        point = f"sink.{self.name}.{operation}"
        injected = self.plan.hit(point)
        if injected is not None:
            if operation == "recover":
                # recover() returns a list, not an outcome: report it the way a
                # real sink would, with the matching error type.
                error = RetryableError if isinstance(injected, Retryable) else FatalError
                raise error(f"recover() of sink {self.name!r}: {injected}")
            return injected
        result = getattr(self.inner, operation)(*args)
        self.plan.hit(point, "after")
        return result

    def bind(self, writer: WriterIdentity) -> None:
        bind_writer(self.inner, writer)

    def close(self) -> None:
        closer = getattr(self.inner, "close", None)
        if closer is not None:
            closer()

    def stage(self, txn_id: SinkTxnId, rows: Iterable[Any]) -> SinkOutcome:
        return self._call("stage", txn_id, rows)  # type: ignore[no-any-return]

    def prepare(self, txn_id: SinkTxnId) -> SinkOutcome:
        return self._call("prepare", txn_id)  # type: ignore[no-any-return]

    def commit(self, txn_id: SinkTxnId) -> SinkOutcome:
        return self._call("commit", txn_id)  # type: ignore[no-any-return]

    def abort(self, txn_id: SinkTxnId) -> SinkOutcome:
        return self._call("abort", txn_id)  # type: ignore[no-any-return]

    def recover(self) -> Sequence[SinkTxnId]:
        return self._call("recover")  # type: ignore[no-any-return]
