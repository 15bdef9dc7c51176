"""Contract types shared by every package: sink outcomes, txn ids, changes, errors.

The errors live in ``reconcile.core.errors`` and are exported from here too.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

from reconcile.core.errors import (
    ConfigurationError,
    ContractViolationError,
    DeterministicError,
    EpochOrderError,
    FatalError,
    FencedError,
    InvalidInputError,
    MarkerMismatchError,
    MassChangeError,
    ObjectTooLargeError,
    OutcomeUnknownError,
    ReconcileError,
    RejectedError,
    RetryableError,
    RowsRejectedError,
    StoreIntegrityError,
    StoreLostRowsError,
    TxnIdParseError,
    UnknownSinkError,
    UntrustedRecordError,
)

if TYPE_CHECKING:
    from reconcile.core.claims import Decisions

__all__ = [
    "NAME_PATTERN",
    "OK",
    "Change",
    "ConfigurationError",
    "ContractViolationError",
    "DeterministicError",
    "EpochOrderError",
    "Fatal",
    "FatalError",
    "FencedError",
    "InvalidInputError",
    "MarkerMismatchError",
    "MassChangeError",
    "ObjectTooLargeError",
    "Ok",
    "OutcomeUnknownError",
    "ReconcileError",
    "RejectedError",
    "Retryable",
    "RetryableError",
    "Row",
    "RowsRejectedError",
    "SinkOutcome",
    "SinkTxnId",
    "StoreIntegrityError",
    "StoreLostRowsError",
    "TxnIdParseError",
    "UnknownSinkError",
    "UntrustedRecordError",
    "WriterIdentity",
    "validate_name",
]

Row: TypeAlias = Mapping[str, Any]

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

    ``decisions``, when set, is where the sink learns what the store has
    decided (``reconcile.core.claims``): a record the sink finds (a commit, a
    repair, a newest-epoch mark) is trusted only for epochs the store decided
    and generations it granted. The commit cycle always sets it; a sink bound
    without it (used directly, without a store) checks log ids only. It is not
    part of equality: binding the same writer again is the same writer.
    """

    pipeline: str
    log_id: str
    decisions: Decisions | None = field(default=None, compare=False, repr=False)

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
