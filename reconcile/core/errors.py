"""The engine's errors: one root, the retryable, fatal and bad-input kinds, and their causes.

Every error survives pickling (Spark executors send them back to the driver as
text and as objects), so each keeps its state in ``message`` and ``details``.
``reconcile.core.contract`` exports them beside the sink outcomes they travel in.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "ConfigurationError",
    "ContractViolationError",
    "DeterministicError",
    "EpochOrderError",
    "FatalError",
    "FencedError",
    "InvalidInputError",
    "MarkerMismatchError",
    "MassChangeError",
    "ObjectTooLargeError",
    "OutcomeUnknownError",
    "ReconcileError",
    "RejectedError",
    "RetryableError",
    "RowsRejectedError",
    "StoreIntegrityError",
    "StoreLostRowsError",
    "TxnIdParseError",
    "UnknownSinkError",
    "UntrustedRecordError",
]


def _rebuild_error(cls: type[ReconcileError], message: str, details: dict[str, Any]) -> Any:
    """Unpickle a ReconcileError subclass without calling its ``__init__``."""
    err = cls.__new__(cls)
    ReconcileError.__init__(err, message, **details)
    return err


class ReconcileError(Exception):
    """Root of every error this project raises.

    Errors survive pickling (Spark executors send them back to the driver), so
    every subclass keeps its state in ``message`` and ``details`` only.
    """

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details: dict[str, Any] = dict(details)

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_error, (type(self), self.message, self.details))


class RetryableError(ReconcileError):
    """The operation failed and did not take effect: it is safe to run it again."""


class FatalError(ReconcileError):
    """The operation failed in a way a retry cannot fix: stop and resolve on restart."""


class OutcomeUnknownError(ReconcileError):
    """We do not know whether the operation took effect (e.g. COMMIT with no reply).

    Never retried blindly and never guessed: resolved from the external system
    (xid status, commit marker) or by pull-and-diff.
    """


class FencedError(FatalError):
    """A stale writer (an older generation) tried to write after a newer one took over."""


class MarkerMismatchError(FatalError):
    """A sink holds a commit of this epoch that the pipeline's state did not write.

    The marker (or batch header, or commit record) names another target table
    or another progress log: a smoke run into another table under the same
    names, or a re-run with fresh state. Treating it as "already committed"
    would skip the epoch silently, so it is an error that says what was found.
    """


class ObjectTooLargeError(FatalError):
    """An object the engine reads from a sink's system is larger than any it writes there.

    Log entries, table metadata and the like are read whole, and anyone who
    can write the sink can make one of any size: each such read is bounded,
    and an object past the bound is refused, unread, rather than parsed into
    memory. ``details``: ``path`` (the object), ``size`` (its bytes) and
    ``limit`` (the bound).
    """


class UntrustedRecordError(MarkerMismatchError):
    """A record in a sink claims more than the store decided: it is refused, never trusted.

    A "committed" or "repair" record (a snapshot summary, a commit-log entry, a
    marker row, a high-water mark) claims epochs past the newest the store has
    decided, or names a writer generation newer than the newest the store
    granted. This pipeline's writer never writes such a record: whoever can
    write the sink's table or bucket can. Trusting it would make every epoch it
    claims report success and write nothing, so the epoch is NOT treated as
    committed and nothing was written (``reconcile.core.claims``).

    ``details``: ``sink``, ``record`` (where it is), ``kind``, ``first_epoch``
    and ``epoch`` (what it claims), ``generation``, ``decided_epoch`` and
    ``fence`` (what the store decided).
    """


class RejectedError(FatalError):
    """The database refused an epoch's rows or statement for good: every retry fails the same way.

    The engine's own check of the rows, before they are sent, raises the
    subclass ``RowsRejectedError``: one kind of failure, whoever found it.

    A constraint (CHECK, NOT NULL, unique, foreign key, exclusion), a value the
    column cannot hold, a missing privilege or a row-level security policy
    (the SQLSTATEs are listed in ``reconcile.core.decisions.REJECTING_SQLSTATE``).
    Nothing of the epoch was written. The pipeline stops: a retry or a
    restart would only repeat it, and a restart would claim a writer
    generation each time. An operator fixes the rows or the table, then runs
    the pipeline again.

    ``details`` say where, when the database names it: ``epoch``, ``table``,
    ``sink``, ``constraint``, ``column``, ``sqlstate``.
    """

    @classmethod
    def of(
        cls,
        *,
        epoch: int,
        table: str,
        sqlstate: str,
        reason: str,
        sink: str | None = None,
        constraint: str | None = None,
        column: str | None = None,
    ) -> RejectedError:
        """The error with its one-line message: the epoch, the table, the constraint or column.

        Args:
            epoch: the epoch whose rows were refused.
            table: the table that refused them, as it is shown to an operator.
            sqlstate: the database's SQLSTATE (five characters), or "" if none.
            reason: what the database said (one line, no row values, no secret).
            sink: the sink's name.
            constraint: the constraint the database named, if any.
            column: the column the database named, if any.
        """
        named = (
            f", constraint {constraint}" if constraint else f", column {column}" if column else ""
        )
        state = f" [{sqlstate}]" if sqlstate else ""
        reason = " ".join(reason.split())
        return cls(
            f"epoch {epoch}: rejected by the database: table {table}{named}{state}: {reason}; "
            "nothing of the epoch was written. Fix the rows or the table, then run again",
            epoch=epoch,
            table=table,
            sink=sink,
            constraint=constraint,
            column=column,
            sqlstate=sqlstate,
        )

    @property
    def epoch(self) -> int | None:
        """The epoch the database refused."""
        value = self.details.get("epoch")
        return int(value) if value is not None else None

    @property
    def table(self) -> str | None:
        """The table that refused it."""
        return self.details.get("table")

    @property
    def sqlstate(self) -> str:
        """The database's SQLSTATE ("" if it gave none)."""
        return str(self.details.get("sqlstate") or "")


class InvalidInputError(ReconcileError):
    """Bad input from the caller; nothing was written."""


class RowsRejectedError(RejectedError, InvalidInputError):
    """The engine refused an epoch's rows before sending them, as the database would have.

    A NULL in a NOT NULL or key column, a value the column cannot hold, a
    column the table lacks, a key twice in one epoch: the sink's or the
    store's own check found it before anything was written. It is a
    rejection like the database's (``RejectedError``: the same exit code, the
    same metric, the pipeline stops), whoever found it first; and bad input
    (``InvalidInputError``) to code that asks for that. ``details`` as
    RejectedError's, with the SQLSTATE the database would have given where
    there is one (23502 for a NULL in a NOT NULL column).
    """


class ConfigurationError(InvalidInputError):
    """The pipeline, a sink or a store is declared wrongly (names, DSNs, settings)."""


class TxnIdParseError(InvalidInputError):
    """A sink txn id string does not have the form ``<pipeline>-<sink>-<epoch>-g<gen>``."""


class EpochOrderError(InvalidInputError):
    """An epoch went backwards (or skipped where that is not allowed)."""


class UnknownSinkError(InvalidInputError):
    """Rows were addressed to a sink that the pipeline did not declare."""


class DeterministicError(FatalError):
    """A step failed with an error that is the same on every attempt, so no retry can cure it.

    The engine's own code or a library it calls raised a programming or data
    error (a TypeError, ValueError, NotImplementedError, ...), not a failure of
    a service. Retrying, or restarting to retry, would only repeat it, claiming
    a writer generation each time. ``details["cause"]`` names the exception type.
    """


class ContractViolationError(FatalError):
    """A sink broke the contract, e.g. returned something that is not a SinkOutcome."""


class StoreIntegrityError(InvalidInputError):
    """An expected-state table holds what the engine did not write; recovery will not trust it.

    A commit the engine did not write added, removed or re-described data
    files, or a file no longer matches its log entry. Nothing was pulled or
    written. ``details`` name the files, their epochs and the commits.
    """


class StoreLostRowsError(StoreIntegrityError):
    """An expected-state table lost rows its log records (files removed, emptied or replaced).

    Read as it is, the store would make a repair delete healthy sink rows as
    "extra": the store is reported instead, with the files and epochs it lost.
    """


class MassChangeError(InvalidInputError):
    """A repair would delete or change more of a sink table than its brake allows.

    Nothing was written. ``details`` hold the counts; an operator who has
    checked the difference repairs with the brake lifted (``allow_mass_change``).
    """
