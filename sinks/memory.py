"""In-memory two-phase-commit sink, for property tests: the external system is a plain object."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from reconcile.contract import OK, Fatal, Retryable, SinkOutcome, SinkTxnId, validate_name

__all__ = ["MemorySink", "MemoryStore"]


@dataclass
class MemoryStore:
    """The "external system" behind memory sinks: survives a client's crash.

    ``prepared`` and ``committed`` map a txn's key (pipeline, sink, epoch) to
    the txn and its rows. ``generations`` is the fence: the newest writer
    generation seen per (pipeline, sink).
    """

    prepared: dict[tuple[str, str, int], tuple[SinkTxnId, list[Any]]] = field(default_factory=dict)
    committed: dict[tuple[str, str, int], tuple[SinkTxnId, list[Any]]] = field(default_factory=dict)
    generations: dict[tuple[str, str], int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


class MemorySink:
    """A TwoPhaseSink over a :class:`MemoryStore`. Staged rows live in the client only."""

    def __init__(self, name: str, store: MemoryStore) -> None:
        self._name = validate_name("sink", name)
        self.store = store
        self._staged: dict[SinkTxnId, list[Any]] = {}

    @property
    def name(self) -> str:
        return self._name

    def _fenced(self, txn_id: SinkTxnId) -> SinkOutcome | None:
        fence_key = (txn_id.pipeline, txn_id.sink)
        newest = self.store.generations.get(fence_key, 0)
        if txn_id.generation < newest:
            return Fatal(f"{txn_id}: fenced, generation {newest} has taken over")
        self.store.generations[fence_key] = txn_id.generation
        return None

    def stage(self, txn_id: SinkTxnId, rows: Iterable[Any]) -> SinkOutcome:
        self._staged[txn_id] = list(rows)
        return OK

    def prepare(self, txn_id: SinkTxnId) -> SinkOutcome:
        with self.store.lock:
            fenced = self._fenced(txn_id)
            if fenced is not None:
                return fenced
            if txn_id.key in self.store.committed:
                return OK  # already committed: prepare has nothing left to do
            if txn_id not in self._staged:
                # Staged rows are lost with the client (a restart): stage again.
                return Retryable(f"{txn_id}: nothing staged in this client")
            self.store.prepared[txn_id.key] = (txn_id, list(self._staged.pop(txn_id)))
            return OK

    def commit(self, txn_id: SinkTxnId) -> SinkOutcome:
        with self.store.lock:
            # Before the fence: committing an epoch that is in is OK whoever
            # asks (a recovering writer may hold a stale writer's leftover).
            if txn_id.key in self.store.committed:
                held = self.store.prepared.get(txn_id.key)
                if held is not None and held[0] == txn_id:
                    del self.store.prepared[txn_id.key]  # a leftover of this epoch
                return OK  # idempotent: this epoch is already in the sink
            fenced = self._fenced(txn_id)
            if fenced is not None:
                return fenced
            if txn_id.key not in self.store.prepared:
                return Fatal(f"{txn_id}: commit of a txn that was never prepared")
            self.store.committed[txn_id.key] = self.store.prepared.pop(txn_id.key)
            return OK

    def abort(self, txn_id: SinkTxnId) -> SinkOutcome:
        with self.store.lock:
            self._staged.pop(txn_id, None)
            if txn_id.key in self.store.committed:
                return Fatal(f"{txn_id}: abort of a committed txn; committed data stays")
            held = self.store.prepared.get(txn_id.key)
            # A stale writer's abort must not discard a newer writer's batch.
            if held is not None and held[0].generation <= txn_id.generation:
                del self.store.prepared[txn_id.key]
            return OK

    def recover(self) -> Sequence[SinkTxnId]:
        with self.store.lock:
            return sorted(txn for txn, _ in self.store.prepared.values() if txn.sink == self._name)
