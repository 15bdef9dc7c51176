"""The sink harness: how the contract and chaos suites drive and inspect any sink."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any, Protocol

from reconcile.core.contract import SinkTxnId
from reconcile.core.sink import TwoPhaseSink

# Rows used by the contract and chaos suites: a unique key and a value.
ChaosRow = dict[str, Any]  # {"k": str, "v": int}

# A row's value carries the run that computed it (the nonce), so that a replay
# that writes anything is visible: an epoch must hold the rows of ONE run.
_NONCE = 1_000_000


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
        """Epoch -> every row WRITE the external system holds for that epoch.

        Not the current rows but every write that was committed: a row that
        was written twice appears twice, even where the second write replaced
        the first (an upsert, a keyed batch). The suites check multisets.
        """
        ...

    def prepared(self, name: str) -> list[SinkTxnId]:
        """Txns the external system holds prepared but not committed."""
        ...


def rows_for(epoch: int, count: int = 3, nonce: int = 0) -> list[ChaosRow]:
    """The output of ``epoch`` as computed by run ``nonce`` (replays differ in ``v``)."""
    return [{"k": f"e{epoch}-r{i}", "v": nonce * _NONCE + epoch * 1000 + i} for i in range(count)]


def epoch_problems(epoch: int, rows: Sequence[ChaosRow], count: int = 3) -> list[str]:
    """What is wrong with the rows a sink holds for ``epoch`` (empty: exactly once).

    Exactly once means: every key of the epoch once (none lost, none
    duplicated), every row under its own epoch, and every value from the same
    run (a replay that wrote anything mixes two runs, or repeats a key).
    """
    problems = []
    keys = Counter(str(r["k"]) for r in rows)
    want = Counter(str(r["k"]) for r in rows_for(epoch, count))
    if keys != want:
        lost = sorted((want - keys).elements())
        extra = sorted((keys - want).elements())
        problems.append(f"epoch {epoch}: lost {lost}, duplicated or foreign {extra}")
    runs = {int(r["v"]) // _NONCE for r in rows}
    if len(runs) > 1:
        problems.append(f"epoch {epoch}: rows of {len(runs)} runs mixed ({sorted(runs)})")
    for r in rows:
        if int(r["v"]) % _NONCE != epoch * 1000 + int(str(r["k"]).rsplit("-r", 1)[1]):
            problems.append(f"epoch {epoch}: row {r} does not belong to it")
    return problems
