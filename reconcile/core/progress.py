"""The progress log: the durable record of which epochs are decided, committed, finalized."""

from __future__ import annotations

import enum
import uuid
from dataclasses import dataclass, field
from typing import Any, Protocol

from reconcile.core import hooks
from reconcile.core.contract import FatalError, FencedError, InvalidInputError

__all__ = [
    "EpochStatus",
    "MemoryProgressLog",
    "ProgressLog",
    "ProgressState",
    "StateBackedLog",
    "numbered",
]

# The window between a writer's fence check and its locked append: a takeover
# that lands here must still be caught by the re-check under the lock.
MARK_CHECKED = hooks.declare("progress.mark.fence_checked")


class EpochStatus(enum.Enum):
    """Where an epoch stands in the commit cycle, as far as the durable log knows."""

    DECIDED = "decided"  # outputs staged, progress recorded; not yet the commit point
    COMMITTED = "committed"  # the commit point: every sink must end up with this epoch
    FINALIZED = "finalized"  # every sink committed it; nothing left to do
    ABORTED = "aborted"  # no sink may keep it; the epoch will be retried
    UNKNOWN = "unknown"  # older than what the log still holds (truncated)


# Allowed transitions. Writing the status an epoch already has is a no-op (I3).
_NEXT: dict[EpochStatus | None, set[EpochStatus]] = {
    None: {EpochStatus.DECIDED, EpochStatus.ABORTED},
    EpochStatus.DECIDED: {EpochStatus.COMMITTED, EpochStatus.ABORTED},
    EpochStatus.ABORTED: {EpochStatus.DECIDED},
    EpochStatus.COMMITTED: {EpochStatus.FINALIZED},
    EpochStatus.FINALIZED: set(),
}


class ProgressLog(Protocol):
    """Durable record of progress: which epochs are decided, committed, finalized.

    Writes carry the writer's generation; a write from a generation older than
    the newest claimed one raises FencedError (I5). ``log_id`` identifies the
    log itself: it is fixed at creation, so sinks can tell this pipeline's
    commits from those of another (or a wiped and recreated) state.
    """

    @property
    def log_id(self) -> str:
        """The log's identity, fixed when it was created."""
        ...

    def claim_generation(self) -> int:
        """Start a new writer generation and fence every older one. Returns it."""
        ...

    def newest_generation(self) -> int:
        """The newest writer generation claimed so far (0: none): the fence.

        A sink's record naming a newer generation was not written by this
        log's writers (``reconcile.core.claims``).
        """
        ...

    def mark(self, epoch: int, status: EpochStatus, generation: int) -> None:
        """Durably move ``epoch`` to ``status``. Idempotent; illegal moves raise FatalError."""
        ...

    def status(self, epoch: int) -> EpochStatus | None:
        """The epoch's status; None if never recorded, UNKNOWN if truncated away."""
        ...

    def last_committed(self) -> int | None:
        """The newest epoch that reached COMMITTED (or FINALIZED), if any."""
        ...

    def epochs_in(self, status: EpochStatus) -> list[int]:
        """Every epoch currently in ``status``, ascending."""
        ...


@dataclass
class ProgressState:
    """The pure state machine behind every progress log: entries in, statuses out."""

    generation: int = 0
    log_id: str | None = None  # set by the log's first entry
    horizon: int = 0  # epochs below this were truncated; their status is UNKNOWN
    statuses: dict[int, EpochStatus] = field(default_factory=dict)
    last_committed: int | None = None
    # Which generation passed each epoch's commit point (an operator settling a
    # stranded prepared txn needs to know whether it was that attempt).
    committed_by: dict[int, int] = field(default_factory=dict)

    def check_generation(self, generation: int) -> None:
        if generation < self.generation:
            raise FencedError(
                f"progress log write by generation {generation} rejected: generation "
                f"{self.generation} has taken over (this writer is a zombie and must stop)",
                generation=generation,
                current=self.generation,
            )

    def check_move(self, epoch: int, status: EpochStatus) -> bool:
        """True if the move changes something; raise FatalError if it is illegal."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise InvalidInputError(f"epoch must be an int >= 0, got {epoch!r}")
        current = self.status_of(epoch)
        if current == status:
            return False
        if current is EpochStatus.UNKNOWN or status not in _NEXT[current]:
            raise FatalError(
                f"progress log: epoch {epoch} cannot move from "
                f"{current.value if current else 'unrecorded'} to {status.value}",
                epoch=epoch,
            )
        return True

    def status_of(self, epoch: int) -> EpochStatus | None:
        if epoch in self.statuses:
            return self.statuses[epoch]
        return EpochStatus.UNKNOWN if epoch < self.horizon else None

    def apply(self, entry: dict[str, Any]) -> None:
        kind = entry["t"]
        if kind == "id":
            # The first identity wins: a second one (two creators racing) is ignored.
            self.log_id = self.log_id or str(entry["log_id"])
        elif kind == "gen":
            self.generation = max(self.generation, int(entry["gen"]))
        elif kind == "epoch":
            epoch, status = int(entry["epoch"]), EpochStatus(entry["status"])
            self.statuses[epoch] = status
            if status is EpochStatus.COMMITTED and "gen" in entry:
                self.committed_by[epoch] = int(entry["gen"])
            if status in (EpochStatus.COMMITTED, EpochStatus.FINALIZED):
                self.last_committed = max(epoch, self.last_committed or 0)
        elif kind == "last":
            # Written by compaction: the newest committed epoch, whose own entry
            # may be gone below the horizon.
            epoch = int(entry["epoch"])
            self.last_committed = (
                epoch if self.last_committed is None else max(epoch, self.last_committed)
            )
        elif kind == "horizon":
            self.horizon = max(self.horizon, int(entry["epoch"]))
            for epoch in [e for e in self.statuses if e < self.horizon]:
                del self.statuses[epoch]
                self.committed_by.pop(epoch, None)
        else:
            raise FatalError(f"progress log: unknown entry type {kind!r}")

    def epochs_in(self, status: EpochStatus) -> list[int]:
        return sorted(e for e, s in self.statuses.items() if s is status)

    def compaction_horizon(self, keep_epochs: int) -> int:
        """Where compaction may cut: keep ``keep_epochs`` finalized epochs and all others."""
        finalized = self.epochs_in(EpochStatus.FINALIZED)
        cut = max(self.horizon, finalized[-1] + 1 - keep_epochs) if finalized else self.horizon
        pending = [e for e, s in self.statuses.items() if s is not EpochStatus.FINALIZED]
        return min([cut, *pending])

    def snapshot(self, horizon: int) -> list[dict[str, Any]]:
        """Entries that rebuild this state with everything below ``horizon`` forgotten."""
        entries: list[dict[str, Any]] = [
            {"t": "id", "log_id": self.log_id},
            {"t": "gen", "gen": self.generation},
        ]
        if horizon:
            entries.append({"t": "horizon", "epoch": horizon, "gen": self.generation})
        if self.last_committed is not None:
            entries.append({"t": "last", "epoch": self.last_committed})
        for epoch in sorted(e for e in self.statuses if e >= horizon):
            status = self.statuses[epoch]
            if epoch in self.committed_by:
                # The commit point's entry with the generation that wrote it.
                gen = self.committed_by[epoch]
                entries.append({"t": "epoch", "epoch": epoch, "status": "committed", "gen": gen})
            if status is not EpochStatus.COMMITTED or epoch not in self.committed_by:
                entries.append(
                    {"t": "epoch", "epoch": epoch, "status": status.value, "gen": self.generation}
                )
        return entries


class StateBackedLog:
    """Shared logic of the log backends; subclasses persist entries in ``_append``."""

    _state: ProgressState

    def _append(self, entry: dict[str, Any]) -> dict[str, Any]:
        """Persist ``entry`` and apply it; a ``gen`` entry gets its number here."""
        raise NotImplementedError

    def _refresh(self) -> None:
        """Pick up entries written by other writers (a newer generation, say)."""

    def claim_generation(self) -> int:
        return int(self._append({"t": "gen"})["gen"])

    def newest_generation(self) -> int:
        self._refresh()
        return self._state.generation

    def check_writer(self, generation: int) -> None:
        """Raise FencedError if a generation newer than ``generation`` has claimed since."""
        self._refresh()
        self._state.check_generation(generation)

    @property
    def log_id(self) -> str:
        if self._state.log_id is None:
            raise FatalError("progress log has no identity entry")
        return self._state.log_id

    def mark(self, epoch: int, status: EpochStatus, generation: int) -> None:
        self._refresh()
        self._state.check_generation(generation)
        if self._state.check_move(epoch, status):
            hooks.point(MARK_CHECKED)
            self._append({"t": "epoch", "epoch": epoch, "status": status.value, "gen": generation})

    def status(self, epoch: int) -> EpochStatus | None:
        self._refresh()
        return self._state.status_of(epoch)

    def last_committed(self) -> int | None:
        self._refresh()
        return self._state.last_committed

    def epochs_in(self, status: EpochStatus) -> list[int]:
        self._refresh()
        return self._state.epochs_in(status)

    def truncate(self, before_epoch: int, generation: int) -> None:
        """Forget finalized epochs below ``before_epoch`` (housekeeping).

        Raises:
            FatalError: if an epoch below it is not finalized yet; recovery
                still needs its status.
        """
        self._refresh()
        self._state.check_generation(generation)
        pending = [
            e
            for e, s in self._state.statuses.items()
            if e < before_epoch and s is not EpochStatus.FINALIZED
        ]
        if pending:
            raise FatalError(
                f"progress log: cannot truncate below {before_epoch}: "
                f"epochs {pending} are not finalized"
            )
        self._append({"t": "horizon", "epoch": before_epoch, "gen": generation})


class MemoryProgressLog(StateBackedLog):
    """Progress log in memory: "durable" for as long as the object lives (tests)."""

    def __init__(self) -> None:
        self._state = ProgressState(log_id=uuid.uuid4().hex)

    def _append(self, entry: dict[str, Any]) -> dict[str, Any]:
        entry = numbered(entry, self._state)
        self._state.apply(entry)
        return entry


def numbered(entry: dict[str, Any], state: ProgressState) -> dict[str, Any]:
    """Give a generation claim the number after the newest one seen."""
    if entry["t"] == "gen":
        return {"t": "gen", "gen": state.generation + 1}
    return entry
