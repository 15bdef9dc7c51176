"""The lifecycle of a sink whose ``prepare`` leaves the epoch's transaction open until ``commit``.

The Postgres sink's transactional mode and the SQL sink work the same way:
``prepare`` opens a database transaction, writes the epoch's rows and its
marker, and leaves it open; ``commit`` commits it; ``abort`` rolls it back.
Nothing is durable before the COMMIT, so ``recover`` lists nothing, and the
marker (written in the same transaction as the rows) is the only evidence of
an epoch that is not open in this process.

:class:`OpenTxnSink` fixes that order once, as Flink's
``TwoPhaseCommitSinkFunction`` does: ``commit``, ``abort``, ``recover`` and the
bookkeeping of open transactions are here; a sink fills in the steps that
speak to its database (commit one open transaction, roll one back, read the
marker).
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from reconcile.core.contract import OK, Fatal, Ok, SinkOutcome, SinkTxnId

__all__ = ["Key", "OpenTxn", "OpenTxnSink"]

log = logging.getLogger("reconcile.sinks")

Key = tuple[str, str, int]  # SinkTxnId.key: (pipeline, sink, epoch)
Held = TypeVar("Held")  # what a sink holds of an open transaction (a session, a connection)
Staged = TypeVar("Staged")  # an epoch's staged rows, as the sink keeps them


@dataclass
class OpenTxn(Generic[Held]):
    """An epoch txn that ``prepare`` left open, waiting for ``commit``.

    Attributes:
        txn_id: the txn.
        held: the open transaction; None when ``prepare`` found the epoch
            committed already (its marker), so ``commit`` has nothing to commit.
    """

    txn_id: SinkTxnId
    held: Held | None


class OpenTxnSink(ABC, Generic[Held, Staged]):
    """Template of the open-transaction lifecycle; a sink fills in the database steps.

    A sink calls ``OpenTxnSink.__init__`` from its own, records what its
    ``prepare`` opened with :meth:`_hold` (or :meth:`_hold_committed`), and
    rolls back whatever is still open in its ``close`` with :meth:`_discard_all`.
    """

    def __init__(self) -> None:
        self._open: dict[Key, OpenTxn[Held]] = {}
        self._staged: dict[Key, Staged] = {}

    # -- the steps a sink fills in ------------------------------------------------

    @abstractmethod
    def _check_txn(self, txn_id: SinkTxnId) -> Fatal | None:
        """Fatal for a txn of another sink or pipeline; None for one of ours."""

    @abstractmethod
    def _sink_label(self) -> str:
        """How messages name the sink (``postgres sink 'orders'``)."""

    @abstractmethod
    def _commit_open(self, txn_id: SinkTxnId, held: Held) -> SinkOutcome:
        """COMMIT an open transaction; settle one without a definite answer (never guess)."""

    @abstractmethod
    def _settle_by_marker(self, txn_id: SinkTxnId) -> SinkOutcome:
        """``commit`` of an epoch with no open transaction here: the marker says if it is in.

        OK if this writer's marker is there; Fatal if another state's is, or if
        there is none (the open transaction died with its connection or process:
        the epoch must be prepared again).
        """

    @abstractmethod
    def _read_marker(self, txn_id: SinkTxnId) -> SinkOutcome | None:
        """The epoch's marker as an outcome: OK (this writer's), Fatal (another's), None (none).

        Raises:
            whatever :attr:`_marker_unreadable` lists, when it cannot be read.
        """

    @abstractmethod
    def _roll_back(self, held: Held) -> None:
        """Roll back an open transaction and let go of its connection, never raising.

        Why never raising: ``abort`` and ``close`` run while the cycle already
        handles a failure, which a second one must not hide; and a transaction
        whose rollback fails has lost its connection, so the server rolls it
        back anyway. A failed rollback is logged and its connection closed.
        """

    # What _read_marker raises when the database cannot be read (abort then says OK).
    _marker_unreadable: tuple[type[BaseException], ...] = ()

    # -- the lifecycle ------------------------------------------------------------

    def commit(self, txn_id: SinkTxnId) -> SinkOutcome:
        """COMMIT the epoch's open transaction; without one here, the marker settles it."""
        if (bad := self._check_txn(txn_id)) is not None:
            return bad
        txn = self._open.pop(txn_id.key, None)
        if txn is not None and txn.held is not None:
            outcome = self._commit_open(txn_id, txn.held)
        else:
            # No open txn here (a restart, or prepare found the epoch in already):
            # the marker, written in the same transaction as the rows, decides.
            outcome = self._settle_by_marker(txn_id)
        if isinstance(outcome, Ok):
            self._staged.pop(txn_id.key, None)
        return outcome

    def abort(self, txn_id: SinkTxnId) -> SinkOutcome:
        """Roll back the epoch's open transaction and drop its staged rows. OK if there is none.

        Fatal for an epoch that is committed (committed data stays) or whose
        marker another state wrote.
        """
        if (bad := self._check_txn(txn_id)) is not None:
            return bad
        had_open = txn_id.key in self._open
        self._discard(txn_id.key)
        self._staged.pop(txn_id.key, None)
        if had_open:
            return OK
        try:
            found = self._read_marker(txn_id)
        except self._marker_unreadable:
            # Nothing of this epoch is open in this process, and an epoch txn
            # never outlives its process: there is nothing to discard.
            return OK
        if found is None:
            return OK
        if not isinstance(found, Ok):
            return found  # another state's marker
        return Fatal(
            f"{self._sink_label()}: abort of {txn_id}, an epoch that is already committed; "
            "committed data stays"
        )

    def recover(self) -> Sequence[SinkTxnId]:
        """Always []: an open transaction never outlives its connection."""
        return []

    # -- bookkeeping of open transactions -----------------------------------------

    def _hold(self, txn_id: SinkTxnId, held: Held) -> None:
        """Keep what ``prepare`` left open, for ``commit`` or ``abort``."""
        self._open[txn_id.key] = OpenTxn(txn_id, held)

    def _hold_committed(self, txn_id: SinkTxnId) -> None:
        """``prepare`` found the epoch committed: ``commit`` settles it by the marker."""
        self._open[txn_id.key] = OpenTxn(txn_id, None)

    def _discard(self, key: Key) -> None:
        """Roll back the epoch's open transaction, if any."""
        txn = self._open.pop(key, None)
        if txn is not None and txn.held is not None:
            self._roll_back(txn.held)

    def _discard_all(self) -> None:
        """Roll back every open transaction (the sink is closing)."""
        for key in list(self._open):
            self._discard(key)
