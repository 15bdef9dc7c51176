"""Contract types shared by every package: errors, sink outcomes, txn ids, changes."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

__all__ = [
    "NAME_PATTERN",
    "OK",
    "Change",
    "ConfigurationError",
    "ContractViolationError",
    "EpochOrderError",
    "Fatal",
    "FatalError",
    "FencedError",
    "InvalidInputError",
    "MarkerMismatchError",
    "MassChangeError",
    "Ok",
    "OutcomeUnknownError",
    "ReconcileError",
    "RejectedError",
    "Retryable",
    "RetryableError",
    "Row",
    "SinkOutcome",
    "SinkTxnId",
    "StoreIntegrityError",
    "StoreLostRowsError",
    "TxnIdParseError",
    "UnknownSinkError",
    "WriterIdentity",
    "validate_name",
]

Row: TypeAlias = Mapping[str, Any]

# ---------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------


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


class RejectedError(FatalError):
    """The database refused an epoch's rows or statement for good: every retry fails the same way.

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


class ConfigurationError(InvalidInputError):
    """The pipeline, a sink or a store is declared wrongly (names, DSNs, settings)."""


class TxnIdParseError(InvalidInputError):
    """A sink txn id string does not have the form ``<pipeline>-<sink>-<epoch>-g<gen>``."""


class EpochOrderError(InvalidInputError):
    """An epoch went backwards (or skipped where that is not allowed)."""


class UnknownSinkError(InvalidInputError):
    """Rows were addressed to a sink that the pipeline did not declare."""


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


# ---------------------------------------------------------------------------
# Sink outcomes
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Ok:
    """The operation took effect (or had already taken effect)."""

    kind: Literal["ok"] = field(default="ok", init=False)

    def __bool__(self) -> bool:
        return True


@dataclass(frozen=True, slots=True)
class Retryable:
    """The operation did not take effect; running it again may succeed.

    ``error``, when set, is the typed cause (picklable, like every ReconcileError);
    it is not part of equality, which compares what the outcome says.
    """

    reason: str
    error: ReconcileError | None = field(default=None, compare=False)
    kind: Literal["retryable"] = field(default="retryable", init=False)

    @classmethod
    def of(cls, error: ReconcileError) -> Retryable:
        """The outcome that carries ``error`` as its cause and its message as its reason."""
        return cls(str(error), error)

    def __bool__(self) -> bool:
        return False


@dataclass(frozen=True, slots=True)
class Fatal:
    """The operation cannot succeed by retrying; the cycle must stop.

    ``error``, when set, is the typed cause (e.g. a FencedError or a
    MarkerMismatchError), so the cycle and the operator keep its type.
    """

    reason: str
    error: ReconcileError | None = field(default=None, compare=False)
    kind: Literal["fatal"] = field(default="fatal", init=False)

    @classmethod
    def of(cls, error: ReconcileError) -> Fatal:
        """The outcome that carries ``error`` as its cause and its message as its reason."""
        return cls(str(error), error)

    def __bool__(self) -> bool:
        return False


SinkOutcome: TypeAlias = Ok | Retryable | Fatal
OK = Ok()

# ---------------------------------------------------------------------------
# Names and ids
# ---------------------------------------------------------------------------

# Names end up in file names, URL paths, Postgres GIDs (200 bytes max) and
# Delta app ids, and '-' separates the parts of a txn id, so a name is a plain
# identifier. 63 is Postgres' identifier limit.
NAME_PATTERN = re.compile(r"[A-Za-z0-9_]{1,63}")


def validate_name(kind: str, name: object) -> str:
    """Return ``name`` if it is a valid pipeline or sink name.

    Raises:
        ConfigurationError: naming the kind and the offending value.
    """
    if not isinstance(name, str) or not name:
        raise ConfigurationError(f"{kind} name must be a non-empty string, got {name!r}")
    if not NAME_PATTERN.fullmatch(name):
        raise ConfigurationError(
            f"{kind} name {name!r} is invalid: use 1 to 63 characters of [A-Za-z0-9_]"
        )
    return name


_TXN_RE = re.compile(
    r"(?P<pipeline>[A-Za-z0-9_]{1,63})-(?P<sink>[A-Za-z0-9_]{1,63})"
    r"-(?P<epoch>0|[1-9][0-9]{0,18})-g(?P<generation>0|[1-9][0-9]{0,18})"
)


@dataclass(frozen=True, slots=True, order=True)
class SinkTxnId:
    """Identifies one sink transaction: ``<pipeline>-<sink>-<epoch>-g<generation>``.

    The triple (pipeline, sink, epoch) is stable across restarts and is what
    idempotency keys on (see :attr:`key`); the generation is the writer's
    fencing number, so a txn prepared by a stale writer can be told apart.
    """

    pipeline: str
    sink: str
    epoch: int
    generation: int = 0

    def __post_init__(self) -> None:
        validate_name("pipeline", self.pipeline)
        validate_name("sink", self.sink)
        for label, value in (("epoch", self.epoch), ("generation", self.generation)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidInputError(f"SinkTxnId {label} must be an int >= 0, got {value!r}")
            if value >= 2**63:
                raise InvalidInputError(f"SinkTxnId {label} {value} does not fit in int64")

    @classmethod
    def from_string(cls, text: str) -> SinkTxnId:
        """Parse the form produced by ``str()``.

        Raises:
            TxnIdParseError: if ``text`` is not a txn id.
        """
        match = _TXN_RE.fullmatch(text) if isinstance(text, str) else None
        if match is None:
            raise TxnIdParseError(
                f"cannot parse sink txn id {text!r}: expected "
                "'<pipeline>-<sink>-<epoch>-g<generation>', names of [A-Za-z0-9_]",
                value=repr(text),
            )
        epoch, generation = int(match["epoch"]), int(match["generation"])
        if epoch >= 2**63 or generation >= 2**63:
            raise TxnIdParseError(f"cannot parse sink txn id {text!r}: number out of int64 range")
        return cls(match["pipeline"], match["sink"], epoch, generation)

    @property
    def key(self) -> tuple[str, str, int]:
        """(pipeline, sink, epoch): the part that idempotency keys on."""
        return (self.pipeline, self.sink, self.epoch)

    def with_generation(self, generation: int) -> SinkTxnId:
        """The same epoch of the same sink, written by another generation."""
        return SinkTxnId(self.pipeline, self.sink, self.epoch, generation)

    def __str__(self) -> str:
        return f"{self.pipeline}-{self.sink}-{self.epoch}-g{self.generation}"


@dataclass(frozen=True, slots=True)
class WriterIdentity:
    """Who decides a pipeline's epochs: the pipeline and the identity of its progress log.

    ``log_id`` is fixed when the durable progress log (or expected-state store)
    is created and never changes after, so a sink that records it beside each
    commit marker can tell its own pipeline's commits from those of another
    state that used the same pipeline and sink names (see MarkerMismatchError).
    The writer generation travels in every SinkTxnId.
    """

    pipeline: str
    log_id: str

    def __post_init__(self) -> None:
        validate_name("pipeline", self.pipeline)
        if not isinstance(self.log_id, str) or not self.log_id:
            raise ConfigurationError(
                f"pipeline {self.pipeline!r}: writer log_id must be a non-empty string, "
                f"got {self.log_id!r}"
            )


# ---------------------------------------------------------------------------
# Changes
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Change:
    """One output row operation for one sink: an upsert or a delete, keyed.

    ``row`` holds the full row for an upsert and at least the key columns for a
    delete. ``change_id`` is the stable id of the change (see
    ``reconcile.core.ids.change_id``), used by append-only targets.
    """

    op: Literal["upsert", "delete"]
    row: Row
    change_id: str | None = None

    def __post_init__(self) -> None:
        if self.op not in ("upsert", "delete"):
            raise InvalidInputError(f"Change op must be 'upsert' or 'delete', got {self.op!r}")
