"""The commit cycle's decisions as pure functions: no I/O, tested on their own."""

from __future__ import annotations

import enum

from reconcile.contract import (
    ContractViolationError,
    EpochOrderError,
    FencedError,
    InvalidInputError,
    MarkerMismatchError,
    ReconcileError,
)
from reconcile.progress import EpochStatus

__all__ = [
    "Settle",
    "check_epoch_number",
    "check_epoch_order",
    "decide_stranded",
    "is_terminal",
]


class Settle(enum.Enum):
    """What start() does with a txn a sink holds prepared but not committed."""

    COMMIT = "commit"
    ABORT = "abort"
    REPORT = "report"  # never guessed: left prepared, and reported to the operator


def decide_stranded(status: EpochStatus | None) -> Settle:
    """Decide a stranded txn from its epoch's status in the progress log.

    The cases, as in Flink's TwoPhaseCommitSinkFunction.initializeState:

    - COMMITTED or FINALIZED: the commit point was passed, so the epoch must
      reach this sink: commit it;
    - DECIDED, ABORTED or never recorded: the commit point was not passed, so
      no sink may keep it: abort it;
    - UNKNOWN (the log was truncated past it): the log cannot say whether the
      commit point was passed. Guessing either way can lose or duplicate an
      epoch, so it is left prepared and reported; pull-and-diff decides.
    """
    if status in (EpochStatus.COMMITTED, EpochStatus.FINALIZED):
        return Settle.COMMIT
    if status is EpochStatus.UNKNOWN:
        return Settle.REPORT
    return Settle.ABORT


def is_terminal(error: BaseException | None) -> bool:
    """Whether ``error`` is one that no retry or restart can cure.

    Bad input and configuration (InvalidInputError, ConfigurationError), a
    broken sink (ContractViolationError), a fenced zombie (FencedError: it must
    step down, not crash-loop) and a marker of another state
    (MarkerMismatchError: retrying would never write the epoch).
    """
    terminal = (InvalidInputError, ContractViolationError, FencedError, MarkerMismatchError)
    return isinstance(error, ReconcileError) and isinstance(error, terminal)


def check_epoch_number(pipeline: str, epoch: object) -> None:
    """Raise EpochOrderError unless ``epoch`` is an int >= 0 (a bool is not one)."""
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
        raise EpochOrderError(f"pipeline {pipeline!r}: epoch must be an int >= 0, got {epoch!r}")


def check_epoch_order(
    pipeline: str, epoch: int, status: EpochStatus | None, last_committed: int | None
) -> None:
    """Raise EpochOrderError if running ``epoch`` would go backwards.

    An epoch below the newest committed one may run only to finish it (it is
    COMMITTED, not yet in every sink); anything else would reorder history.
    """
    last = last_committed
    if last is not None and epoch < last and status is not EpochStatus.COMMITTED:
        raise EpochOrderError(
            f"pipeline {pipeline!r}: epoch {epoch} goes backwards; epoch {last} "
            "is already committed. Nothing was staged.",
            epoch=epoch,
            last_committed=last,
        )
