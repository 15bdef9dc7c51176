"""The commit cycle's decisions as pure functions: no I/O, tested on their own."""

from __future__ import annotations

import enum

from reconcile.core.contract import (
    ContractViolationError,
    DeterministicError,
    EpochOrderError,
    FencedError,
    InvalidInputError,
    MarkerMismatchError,
    ReconcileError,
    RejectedError,
)
from reconcile.core.progress import EpochStatus

__all__ = [
    "DETERMINISTIC",
    "REJECTING_SQLSTATE",
    "Failure",
    "Settle",
    "check_epoch_number",
    "check_epoch_order",
    "classify",
    "decide_stranded",
    "deterministic_error",
    "is_rejection_sqlstate",
    "is_terminal",
    "rejection_of",
]

# SQLSTATE classes (the first two characters) whose errors are a definite
# rejection by the database: the server answered, the transaction rolled back,
# and the same rows fail the same way on every retry. A sink turns them into
# RejectedError; every other SQLSTATE (connection loss 08, serialization 40,
# resources 53, lock or statement timeouts 55P03 and 57014, a terminated
# backend 57P01, internal errors XX) may pass on a retry.
REJECTING_SQLSTATE: dict[str, str] = {
    "21": "cardinality violation (one statement touches a row twice)",
    "22": "data exception (a value the column cannot hold: out of range, too long, malformed)",
    "23": "integrity constraint violation (NOT NULL, foreign key, unique, CHECK, exclusion)",
    "42": "syntax error or access rule violation (42501: a missing privilege or a row-level "
    "security policy; a column or table that is not there)",
    "44": "WITH CHECK OPTION violation (a row outside the view it is written through)",
    "54": "program limit exceeded (a row or an index entry too large)",
}


# Exception types that are the same on every attempt: a programming or data
# error in the engine or in a library it calls (Arrow's ArrowInvalid is a
# ValueError, its ArrowTypeError a TypeError; psycopg cannot parse a date in a
# DateStyle it does not know: NotImplementedError), never a service that is away
# or busy. OSError (a lost connection, a full disk, a timeout) is not one of them,
# nor is a driver's own error class (psycopg's, SQLAlchemy's), which the sinks
# sort themselves; UnicodeError is a ValueError and deterministic too.
DETERMINISTIC: tuple[type[Exception], ...] = (
    TypeError,
    ValueError,
    LookupError,
    AttributeError,
    ArithmeticError,
    NotImplementedError,
)


def deterministic_error(error: BaseException, where: str) -> DeterministicError | None:
    """``error`` as a DeterministicError if its type is one of DETERMINISTIC, else None.

    Args:
        error: an exception that is not the engine's own (a ReconcileError is
            classified as it is).
        where: what failed, for the message ("pipeline 'p': bind() of sink 's'").
    """
    if isinstance(error, ReconcileError) or not isinstance(error, DETERMINISTIC):
        return None
    if isinstance(error, OSError):  # (no OSError is one today; kept out whatever comes)
        return None
    return DeterministicError(
        f"{where} failed with {type(error).__name__}: {error}. The same error comes on "
        "every attempt, so it is not retried: this is a bug, or a setting or value no "
        "retry can change",
        cause=type(error).__name__,
    )


class Failure(enum.Enum):
    """What a failure calls for: the driver, the streaming writer and the HA node ask ``classify``.

    - TRANSIENT: it may pass (a database away or busy, a lost reply, a crash
      whose cure is a restart): back off, then run the epoch again;
    - FENCED: a newer writer took over: stop writing (an HA node steps down);
    - REJECTED: the epoch's rows were refused, by the database
      (``RejectedError``) or by the engine's own check before anything was
      sent (``RowsRejectedError``, a subclass): one kind, whoever found it.
      Stop the pipeline, name the epoch, the table and the constraint or
      column; an operator fixes the rows or the table;
    - TERMINAL: nothing a retry or a restart can cure (bad input or
      configuration, a broken sink, a marker of another state): stop.
    """

    TRANSIENT = "transient"
    FENCED = "fenced"
    REJECTED = "rejected"
    TERMINAL = "terminal"


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


def is_rejection_sqlstate(sqlstate: str | None) -> bool:
    """Whether an error of this SQLSTATE is a definite rejection (``REJECTING_SQLSTATE``)."""
    return sqlstate is not None and len(sqlstate) == 5 and sqlstate[:2] in REJECTING_SQLSTATE


def rejection_of(error: BaseException | None) -> RejectedError | None:
    """The RejectedError that ``error`` is or carries (as its typed cause), if any.

    A rejection can reach the caller wrapped: recovery raises FatalError with
    the sink's error in ``details["error"]``, and Python chains causes.
    """
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, RejectedError):
            return error
        carried = error.details.get("error") if isinstance(error, ReconcileError) else None
        error = carried if isinstance(carried, BaseException) else error.__cause__
    return None


def classify(error: BaseException | None) -> Failure:
    """What ``error`` calls for (see ``Failure``); None and foreign exceptions are TRANSIENT.

    The cases:

    - a RejectedError (a RowsRejectedError too), itself or as the typed
      cause: REJECTED, before the InvalidInputError below;
    - FencedError (a zombie; an HA node that lost its lease): FENCED;
    - InvalidInputError and ConfigurationError (bad input, a bad declaration,
      an epoch that would go backwards), ContractViolationError (a broken
      sink), MarkerMismatchError (a marker of another state, so retrying
      would never write the epoch) and DeterministicError (an error that is
      the same on every attempt): TERMINAL;
    - anything else, including a plain FatalError (a step that a restart's
      ``start()`` settles) and exceptions that are not the engine's: TRANSIENT,
      to be retried with backoff, within a bound.
    """
    if rejection_of(error) is not None:
        return Failure.REJECTED
    if not isinstance(error, ReconcileError):
        return Failure.TRANSIENT
    if isinstance(error, FencedError):
        return Failure.FENCED
    if isinstance(
        error,
        InvalidInputError | ContractViolationError | MarkerMismatchError | DeterministicError,
    ):
        return Failure.TERMINAL
    return Failure.TRANSIENT


def is_terminal(error: BaseException | None) -> bool:
    """Whether ``error`` is one that no retry or restart can cure (``classify`` is not TRANSIENT).

    Bad input and configuration (InvalidInputError, ConfigurationError), a
    rejection by the database (RejectedError), a broken sink
    (ContractViolationError), a fenced zombie (FencedError: it must step down,
    not crash-loop) and a marker of another state (MarkerMismatchError:
    retrying would never write the epoch).
    """
    return classify(error) is not Failure.TRANSIENT


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
