"""The two-phase-commit sink contract: the protocol every sink implements, and its capabilities."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from reconcile.core.contract import (
    ConfigurationError,
    ContractViolationError,
    Fatal,
    Ok,
    Retryable,
    SinkOutcome,
    SinkTxnId,
    WriterIdentity,
    validate_name,
)

__all__ = [
    "SinkCapabilities",
    "TwoPhaseSink",
    "bind_writer",
    "capabilities_of",
    "check_outcome",
    "check_sinks",
    "has_durable_prepare",
]

_MEMBERS = ("name", "stage", "prepare", "commit", "abort", "recover")


@dataclass(frozen=True, slots=True)
class SinkCapabilities:
    """What a sink can do beyond the contract, as a value (not probed with getattr).

    A sink declares ``capabilities`` (a class attribute or a property); the
    engine reads it through :func:`capabilities_of`.

    Attributes:
        durable_prepare: a prepared txn survives a crash of the process that
            prepared it (``recover()`` lists it, another process can commit it).
            False for an open database transaction: after a crash past the
            commit point the epoch is brought into the sink again.
        epoch_column: every row carries the epoch that last wrote it (``_epoch``),
            so recovery can pull only the rows written after a given epoch.
        pullable: the sink's rows can be read back for pull-and-diff.
        bucket_checksums: the sink's system computes per-bucket counts and
            checksums of its rows itself, so only differing buckets are pulled.
        shared_stage: Spark's executors can stage an epoch's rows in a table
            of the sink's own, which its commit reads
            (``reconcile.core.staged.SharedStaging``).
    """

    durable_prepare: bool = True
    epoch_column: bool = False
    pullable: bool = False
    bucket_checksums: bool = False
    shared_stage: bool = False


def capabilities_of(sink: object) -> SinkCapabilities:
    """The capabilities ``sink`` declares; defaults for a sink that declares none.

    A third-party sink written before capabilities existed may still say
    ``durable_prepare = False`` as a plain attribute: that is honoured.
    """
    declared = getattr(sink, "capabilities", None)
    if isinstance(declared, SinkCapabilities):
        return declared
    return SinkCapabilities(durable_prepare=bool(getattr(sink, "durable_prepare", True)))


@runtime_checkable
class TwoPhaseSink(Protocol):
    """A Flink-style two-phase-commit sink.

    Every operation is idempotent: committing a committed txn is OK, aborting an
    unknown txn is OK, preparing a txn that is already prepared replaces it with
    the same content. Idempotency keys on ``txn_id.key`` (pipeline, sink, epoch),
    not on the generation.

    Operations return a :data:`SinkOutcome` (``OK``, ``Retryable(reason)``,
    ``Fatal(reason)``) rather than raising for expected failures. An exception
    that escapes an operation means its outcome is unknown to the caller.
    """

    @property
    def name(self) -> str:
        """The sink's name, unique within a pipeline."""
        ...

    def stage(self, txn_id: SinkTxnId, rows: Iterable[Any]) -> SinkOutcome:
        """Buffer rows for ``txn_id``. Nothing becomes visible or durable."""
        ...

    def prepare(self, txn_id: SinkTxnId) -> SinkOutcome:
        """Make the staged batch durable but invisible.

        Once this returns OK, ``commit`` must eventually succeed, even after a
        crash of this process.
        """
        ...

    def commit(self, txn_id: SinkTxnId) -> SinkOutcome:
        """Make the prepared batch visible atomically. OK if already committed."""
        ...

    def abort(self, txn_id: SinkTxnId) -> SinkOutcome:
        """Discard the staged or prepared batch. OK if there is none."""
        ...

    def recover(self) -> Sequence[SinkTxnId]:
        """List every txn that the external system holds prepared but not committed."""
        ...


def bind_writer(sink: object, writer: WriterIdentity) -> None:
    """Tell ``sink`` who writes through it, if it wants to know (optional ``bind``).

    ``CommitCycle.start()`` calls ``sink.bind(writer)`` before it claims a
    generation and before ``recover()``. A sink uses it to:

    - check that it can reach its system and that its target is usable, so a
      bad DSN or a missing table fails at start-up (raise ConfigurationError
      for what no retry can fix, RetryableError for what may pass);
    - record ``writer.log_id`` beside each commit marker, and refuse (with a
      ``Fatal`` carrying MarkerMismatchError) an epoch whose marker was written
      by another progress log or for another target, instead of answering
      "already committed".

    ``bind`` must be idempotent; a sink without it is used as it is.
    """
    binder = getattr(sink, "bind", None)
    if binder is not None:
        binder(writer)


def has_durable_prepare(sink: object) -> bool:
    """Whether ``sink``'s prepared txns survive a crash of the process that prepared them.

    Postgres in transactional mode says no: its "prepared" txn is an open
    transaction that dies with its connection. Such a sink's ``recover()`` lists
    nothing, and after a crash past the commit point its ``commit`` is OK only
    if the epoch got in; otherwise the cycle brings the epoch into it again,
    which its own idempotency (a commit marker) makes exactly-once.
    """
    return capabilities_of(sink).durable_prepare


def check_outcome(sink: str, operation: str, txn_id: SinkTxnId, value: object) -> SinkOutcome:
    """Return ``value`` if it is a SinkOutcome, else raise ContractViolationError.

    Raises:
        ContractViolationError: naming the sink, the operation and what it returned.
    """
    if isinstance(value, Ok | Retryable | Fatal):
        return value
    raise ContractViolationError(
        f"sink {sink!r} returned {value!r} (type {type(value).__name__}) from "
        f"{operation}({txn_id}); a sink must return OK, Retryable(reason) or Fatal(reason)",
        sink=sink,
        operation=operation,
        txn_id=str(txn_id),
    )


def check_sinks(pipeline: str, sinks: Sequence[object]) -> list[str]:
    """The sinks' names, after checking each is a sink and the names are distinct.

    Raises:
        ConfigurationError: naming the member a sink lacks, a bad name, or a repeated one.
    """
    names: list[str] = []
    for sink in sinks:
        missing = [m for m in _MEMBERS if not hasattr(sink, m)]
        if missing:
            raise ConfigurationError(
                f"pipeline {pipeline!r}: {sink!r} is not a TwoPhaseSink: it lacks "
                f"{', '.join(missing)}"
            )
        name = validate_name("sink", sink.name)  # type: ignore[attr-defined]
        if name in names:
            raise ConfigurationError(f"pipeline {pipeline!r} declares sink {name!r} twice")
        names.append(name)
    return names
