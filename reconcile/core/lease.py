"""A pipeline's leadership lease, as high availability uses it: who should write, for how long.

``reconcile.ha`` is written against :class:`Lease`; a backend provides one
(``sinks.registry.capability(dsn, LEASE)``: PostgreSQL's is a row in the sink
database, ``sinks.postgres.lease.PgLease``). The lease only says who *should*
write: the writer generation, checked inside every sink transaction and every
store commit, is what rejects a stale writer.
"""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

__all__ = ["DEFAULT_TERM_S", "Lease", "LeaseState", "default_holder", "wait_s"]

DEFAULT_TERM_S = 2.0


def default_holder() -> str:
    """``host:pid:random``: unique per process, and says where the holder runs."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"[:120]


@dataclass(frozen=True)
class LeaseState:
    """The lease as its store saw it."""

    pipeline: str
    holder: str
    tenure: int
    expires_at: datetime
    remaining_s: float  # until expiry, in the store's clock; <= 0: expired

    @property
    def expired(self) -> bool:
        """Whether anyone may take it now."""
        return self.remaining_s <= 0


class Lease(Protocol):
    """The leadership lease of one pipeline, held by one instance at a time."""

    @property
    def pipeline(self) -> str:
        """The pipeline it leads."""
        ...

    @property
    def holder(self) -> str:
        """This instance's name as the lease records it."""
        ...

    @property
    def term_s(self) -> float:
        """How long a taken or renewed lease lasts; the holder renews every quarter."""
        ...

    @property
    def tenure(self) -> int | None:
        """The tenure this instance holds (None: it does not hold the lease)."""
        ...

    def held(self) -> bool:
        """Whether this instance surely still holds it, by its own clock."""
        ...

    def try_acquire(self) -> LeaseState | None:
        """Take the lease if it is free, expired, its holder gone, or ours; None if not."""
        ...

    def renew(self) -> bool:
        """Extend our lease by a term; False if it is no longer ours."""
        ...

    def release(self) -> None:
        """Give the lease up, so a standby may take it at once."""
        ...

    def release_locally(self) -> None:
        """Forget that we hold it, without telling the store (it cannot be reached)."""
        ...

    def current(self) -> LeaseState | None:
        """The lease as it stands now; None when nobody ever took it."""
        ...

    def close(self) -> None:
        """Close the lease's connection."""
        ...


def wait_s(state: LeaseState | None, poll_s: float) -> float:
    """How long a standby waits before it tries again: to the expiry, at most ``poll_s``."""
    if state is None or state.expired:
        return 0.0
    return min(poll_s, state.remaining_s + 0.01)
