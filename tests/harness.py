"""The sink harness: how the contract and chaos suites drive and inspect any sink."""

from __future__ import annotations

from typing import Any, Protocol

from reconcile.contract import SinkTxnId
from sinks.base import TwoPhaseSink

# Rows used by the contract and chaos suites: a unique key and a value.
ChaosRow = dict[str, Any]  # {"k": str, "v": int}


class SinkHarness(Protocol):
    """Builds sinks of one kind over one durable external system, and inspects it.

    ``new_sink`` is what a restarted process builds: a fresh client with no
    in-memory state, on the same external system. ``committed`` and
    ``prepared`` read the external system directly, not through a client, so
    the invariants are checked against independent evidence.
    """

    kind: str

    def new_sink(self, name: str) -> TwoPhaseSink:
        """A fresh sink client named ``name`` on the durable external state."""
        ...

    def committed(self, name: str) -> dict[int, list[ChaosRow]]:
        """Epoch -> the rows visible in sink ``name`` that carry that epoch.

        A row committed twice appears twice; the suites check multisets.
        """
        ...

    def prepared(self, name: str) -> list[SinkTxnId]:
        """Txns the external system holds prepared but not committed."""
        ...


def rows_for(epoch: int, count: int = 3) -> list[ChaosRow]:
    """The deterministic output of ``epoch``: what a replay recomputes."""
    return [{"k": f"e{epoch}-r{i}", "v": epoch * 1000 + i} for i in range(count)]
