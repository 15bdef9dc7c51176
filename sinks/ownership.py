"""Whose commit is it: the writer a sink client serves, and the error for another log's commit.

A sink that finds an epoch "already committed" may answer OK only if the
commit it found was made for the same progress log (``WriterIdentity.log_id``).
A commit recorded by another log (a smoke run under the same pipeline and sink
names, or a state folder that was wiped and recreated) is not evidence that
this pipeline's epoch is in the sink: answering OK would make ``run_epoch``
report success while nothing of this run was written. The file, HTTP, Delta
and memory sinks record the log id beside every commit and turn a mismatch
into ``Fatal.of(MarkerMismatchError(...))`` built here.

An unbound sink (used directly, without a commit cycle) is its own writer
with no log id: it records none, so its commits never pass for a bound
pipeline's, nor a bound pipeline's for its own.

A commit of this log's is trusted only as far as the store decided
(``reconcile.core.claims``): :meth:`WriterBinding.untrusted` asks the bound
writer's decisions about it before a sink answers OK.
"""

from __future__ import annotations

from reconcile.core.claims import Claim, check_claim
from reconcile.core.contract import (
    ConfigurationError,
    Fatal,
    MarkerMismatchError,
    SinkTxnId,
    WriterIdentity,
)

__all__ = ["WriterBinding", "describe_log", "foreign_commit", "foreign_prepare"]


class WriterBinding:
    """The writer one sink client serves; ``bind`` is idempotent for the same writer."""

    def __init__(self, what: str) -> None:
        self._what = what
        self.writer: WriterIdentity | None = None

    @property
    def log_id(self) -> str | None:
        """The bound writer's log id; None for an unbound client (its own writer)."""
        return None if self.writer is None else self.writer.log_id

    def untrusted(self, claim: Claim) -> Fatal | None:
        """None if the store's decisions back ``claim`` (or none are bound); else the refusal.

        Ask it about a record of this writer's log that would make the sink
        answer OK (``reconcile.core.claims``): a Fatal carrying an
        UntrustedRecordError, counted and logged, never OK.
        """
        refused = check_claim(claim, None if self.writer is None else self.writer.decisions)
        return None if refused is None else Fatal.of(refused)

    def bind(self, writer: WriterIdentity) -> None:
        """Record ``writer``; binding the same writer again changes nothing.

        Raises:
            ConfigurationError: ``writer`` is not a WriterIdentity, or this client
                is bound to another writer already (a client serves one writer).
        """
        if not isinstance(writer, WriterIdentity):
            raise ConfigurationError(f"{self._what}: bind() takes a WriterIdentity, got {writer!r}")
        if self.writer is not None and self.writer != writer:
            raise ConfigurationError(
                f"{self._what} is bound to pipeline {self.writer.pipeline!r} with progress log "
                f"{self.writer.log_id!r} already; a sink client serves one writer (got pipeline "
                f"{writer.pipeline!r}, log {writer.log_id!r}): build a new sink client"
            )
        self.writer = writer


def describe_log(log_id: str | None) -> str:
    """A log id as it reads in a message."""
    if log_id is None:
        return "no progress log (a sink used directly, without a commit cycle)"
    return f"progress log {log_id!r}"


def foreign_commit(
    what: str,
    txn_id: SinkTxnId,
    where: str,
    *,
    found_txn: str,
    found_log: str | None,
    log_id: str | None,
    location: str,
    advice: str,
) -> Fatal:
    """The outcome for an epoch found committed by another progress log.

    Args:
        what: the sink, as messages name it (e.g. "file sink 'orders'").
        txn_id: the txn being prepared or committed.
        where: the operation ("prepare", "commit").
        found_txn: the txn id the existing commit was made as.
        found_log: the log id recorded with it (None: none recorded).
        log_id: this client's log id.
        location: where the commit was found (a path, a table version, a URL).
        advice: what the operator can do besides resuming with the original state.
    """
    return Fatal.of(
        MarkerMismatchError(
            f"{what}, {where} of {txn_id}: epoch {txn_id.epoch} is already committed in "
            f"{location}, as txn {found_txn} of {describe_log(found_log)}; this pipeline "
            f"writes with {describe_log(log_id)}. The epoch is NOT treated as committed and "
            "nothing was written. Another state wrote it: a run under the same pipeline and "
            "sink names (a smoke run), or a state folder that was wiped or replaced. Resume "
            f"with the original state ({describe_log(found_log)}), or {advice}",
            pipeline=txn_id.pipeline,
            sink=txn_id.sink,
            epoch=txn_id.epoch,
            found_txn=found_txn,
            found_log_id=found_log,
            log_id=log_id,
            location=location,
        )
    )


def foreign_prepare(
    what: str,
    txn_id: SinkTxnId,
    *,
    found_log: str | None,
    log_id: str | None,
    location: str,
) -> Fatal:
    """The outcome for a commit of a batch that another progress log prepared.

    Txn ids of two logs can be equal (both start at generation 1), so the
    prepared batch's owner is checked before it is made visible.
    """
    return Fatal.of(
        MarkerMismatchError(
            f"{what}, commit of {txn_id}: the prepared batch in {location} was prepared by "
            f"{describe_log(found_log)}, not by this pipeline's {describe_log(log_id)}; "
            "nothing was committed. Another state is writing under the same pipeline and "
            "sink names: stop one of them, or give them different sink names.",
            pipeline=txn_id.pipeline,
            sink=txn_id.sink,
            epoch=txn_id.epoch,
            found_log_id=found_log,
            log_id=log_id,
            location=location,
        )
    )
