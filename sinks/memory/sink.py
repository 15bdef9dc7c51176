"""In-memory two-phase-commit sink, for property tests: the external system is a plain object."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from reconcile.core.claims import Claim
from reconcile.core.contract import (
    OK,
    Fatal,
    FencedError,
    Retryable,
    SinkOutcome,
    SinkTxnId,
    WriterIdentity,
    validate_name,
)
from reconcile.core.sink import SinkCapabilities
from sinks.ownership import WriterBinding, foreign_commit, foreign_prepare

__all__ = ["CommitRecord", "MemorySink", "MemoryStore", "open_uri"]


@dataclass(frozen=True)
class CommitRecord:
    """One commit a store actually performed: the txn, its rows, the writer's log id."""

    txn: str
    rows: list[Any]
    log_id: str | None


@dataclass
class MemoryStore:
    """The "external system" behind memory sinks: survives a client's crash.

    ``prepared`` and ``committed`` map a txn's key (pipeline, sink, epoch) to
    the txn and its rows; ``prepared_log_ids`` and ``committed_log_ids`` hold,
    under the same keys, the progress log id of the writer that prepared the
    batch (None: an unbound sink). ``generations`` is the fence: the newest
    writer generation seen per (pipeline, sink).

    ``commit_log`` is append-only, one :class:`CommitRecord` per commit
    performed (never for an "already committed" answer): the keyed state
    cannot show an epoch committed twice, the log does.
    """

    prepared: dict[tuple[str, str, int], tuple[SinkTxnId, list[Any]]] = field(default_factory=dict)
    committed: dict[tuple[str, str, int], tuple[SinkTxnId, list[Any]]] = field(default_factory=dict)
    generations: dict[tuple[str, str], int] = field(default_factory=dict)
    prepared_log_ids: dict[tuple[str, str, int], str | None] = field(default_factory=dict)
    committed_log_ids: dict[tuple[str, str, int], str | None] = field(default_factory=dict)
    commit_log: list[CommitRecord] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


class MemorySink:
    """A TwoPhaseSink over a :class:`MemoryStore`. Staged rows live in the client only.

    ``bind(writer)`` records the writer's progress log id with every batch it
    prepares; an epoch found committed by another log (or by an unbound sink)
    is a Fatal MarkerMismatchError, never OK. Unbound, the sink is its own
    writer with no log id.
    """

    capabilities = SinkCapabilities(durable_prepare=True)

    def __init__(self, name: str, store: MemoryStore) -> None:
        self._name = validate_name("sink", name)
        self.store = store
        self._staged: dict[SinkTxnId, list[Any]] = {}
        self._binding = WriterBinding(f"memory sink {self._name!r}")

    @property
    def name(self) -> str:
        return self._name

    def bind(self, writer: WriterIdentity) -> None:
        """Serve ``writer`` (idempotent); see :class:`sinks.ownership.WriterBinding`."""
        self._binding.bind(writer)

    def _fenced(self, txn_id: SinkTxnId) -> SinkOutcome | None:
        fence_key = (txn_id.pipeline, txn_id.sink)
        newest = self.store.generations.get(fence_key, 0)
        if txn_id.generation < newest:
            return Fatal.of(FencedError(f"{txn_id}: fenced, generation {newest} has taken over"))
        self.store.generations[fence_key] = txn_id.generation
        return None

    def _already_committed(self, txn_id: SinkTxnId, where: str) -> SinkOutcome | None:
        """None if the epoch is not committed; OK if this log committed it; else Fatal."""
        held = self.store.committed.get(txn_id.key)
        if held is None:
            return None
        found = self.store.committed_log_ids.get(txn_id.key)
        if found == self._binding.log_id:
            # This log's batch: believed only as far as the store decided.
            claim = Claim(self._name, f"memory sink {self._name!r}",
                          f"the memory store's batch of {held[0]}", "commit", txn_id.epoch,
                          generation=held[0].generation)  # fmt: skip
            untrusted = self._binding.untrusted(claim)
            return OK if untrusted is None else untrusted
        return foreign_commit(
            f"memory sink {self._name!r}",
            txn_id,
            where,
            found_txn=str(held[0]),
            found_log=found,
            log_id=self._binding.log_id,
            location="the memory store",
            advice="clear that run's batches from the MemoryStore, or use another store.",
        )

    def stage(self, txn_id: SinkTxnId, rows: Iterable[Any]) -> SinkOutcome:
        self._staged[txn_id] = list(rows)
        return OK

    def prepare(self, txn_id: SinkTxnId) -> SinkOutcome:
        with self.store.lock:
            fenced = self._fenced(txn_id)
            if fenced is not None:
                return fenced
            done = self._already_committed(txn_id, "prepare")
            if done is not None:
                return done  # OK: prepare has nothing left to do
            if txn_id not in self._staged:
                # Staged rows are lost with the client (a restart): stage again.
                return Retryable(f"{txn_id}: nothing staged in this client")
            self.store.prepared[txn_id.key] = (txn_id, list(self._staged.pop(txn_id)))
            self.store.prepared_log_ids[txn_id.key] = self._binding.log_id
            return OK

    def commit(self, txn_id: SinkTxnId) -> SinkOutcome:
        with self.store.lock:
            # Before the fence: committing an epoch that is in is OK whoever
            # asks (a recovering writer may hold a stale writer's leftover),
            # as long as it is this log's commit.
            done = self._already_committed(txn_id, "commit")
            if done is not None:
                held = self.store.prepared.get(txn_id.key)
                if done and held is not None and held[0] == txn_id:
                    self._drop_prepared(txn_id.key)  # a leftover of this epoch
                return done
            fenced = self._fenced(txn_id)
            if fenced is not None:
                return fenced
            if txn_id.key not in self.store.prepared:
                return Fatal(f"{txn_id}: commit of a txn that was never prepared")
            owner = self.store.prepared_log_ids.get(txn_id.key)
            if owner != self._binding.log_id:
                return foreign_prepare(
                    f"memory sink {self._name!r}",
                    txn_id,
                    found_log=owner,
                    log_id=self._binding.log_id,
                    location="the memory store",
                )
            txn, rows = self.store.prepared[txn_id.key]
            self._drop_prepared(txn_id.key)
            self.store.committed[txn_id.key] = (txn, rows)
            self.store.committed_log_ids[txn_id.key] = owner
            self.store.commit_log.append(CommitRecord(str(txn), list(rows), owner))
            return OK

    def abort(self, txn_id: SinkTxnId) -> SinkOutcome:
        with self.store.lock:
            self._staged.pop(txn_id, None)
            if txn_id.key in self.store.committed:
                return Fatal(f"{txn_id}: abort of a committed txn; committed data stays")
            held = self.store.prepared.get(txn_id.key)
            # A stale writer's abort must not discard a newer writer's batch.
            if held is not None and held[0].generation <= txn_id.generation:
                self._drop_prepared(txn_id.key)
            return OK

    def recover(self) -> Sequence[SinkTxnId]:
        with self.store.lock:
            return sorted(txn for txn, _ in self.store.prepared.values() if txn.sink == self._name)

    def _drop_prepared(self, key: tuple[str, str, int]) -> None:
        del self.store.prepared[key]
        self.store.prepared_log_ids.pop(key, None)


_STORES: dict[str, MemoryStore] = {}


def open_uri(name: str, uri: str) -> MemorySink:
    """The sink of ``memory://NAME``: every sink of one NAME shares one store, in this process."""
    return MemorySink(name, _STORES.setdefault(urlsplit(uri).netloc, MemoryStore()))
