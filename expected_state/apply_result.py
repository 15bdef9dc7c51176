"""What recording one epoch in a store table did (``ExpectedStateStore.apply``)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ApplyResult"]


@dataclass(frozen=True, slots=True)
class ApplyResult:
    """What :meth:`ExpectedStateStore.apply` did.

    Attributes:
        epoch: the epoch.
        applied: True if this call committed it; False if it was already recorded.
        table_version: the Delta version holding the epoch (None if unknown).
        upserted: rows inserted or replaced (0 on a no-op).
        deleted: delete changes recorded (0 on a no-op); a delete of a key that
            did not exist counts too, since the write path never reads the state.
    """

    epoch: int
    applied: bool
    table_version: int | None
    upserted: int = 0
    deleted: int = 0
