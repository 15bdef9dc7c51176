"""Leadership: the roles, a tenure, and what a leader watches: its lease, its query's failures.

``Heartbeat`` renews the lease in a thread and says when it could not.
``QueryFailures`` decides what a failed streaming query calls for, from the
typed error its writer kept (``reconcile.core.decisions.classify``), and counts the
failures of one epoch in a row, across query runs and tenures.
"""

from __future__ import annotations

import enum
import logging
import threading
from dataclasses import dataclass, field
from typing import Literal

from reconcile.core.contract import FatalError
from reconcile.core.decisions import Failure, classify
from reconcile.core.lease import Lease

__all__ = [
    "QUERY_FAILURES", "RESTART_WAIT_MAX_S", "AfterFailure", "Heartbeat", "QueryFailures", "Role",
    "Tenure",
]  # fmt: skip

log = logging.getLogger("reconcile.ha")

QUERY_FAILURES = 5  # failures of one epoch in a row after which the node stops
RESTART_WAIT_MAX_S = 30.0  # the longest backoff before the query is started again
# Why a failed query is restarted while we lead: a woken old main may win a
# race on Spark's offset or commit log ("concurrent update") before its fence
# stops it; that is a failure of this run of the query, not of the leader.
# Why the failures of one epoch are counted across restarts and tenures, and
# end in a stop rather than a step-down: a leader that stepped down takes the
# lease again a term later and claims a new generation; an epoch that always
# fails would claim generation after generation, and a store commit each, for ever.


class Role(enum.Enum):
    """How an instance starts."""

    MAIN = "main"
    STANDBY = "standby"


@dataclass
class Tenure:
    """One period of leadership of this instance."""

    tenure: int  # the lease's tenure number
    generation: int | None = None  # the writer generation claimed
    acquired_s: float = 0.0  # time.time() when the lease was taken
    started_s: float | None = None  # time.time() when the query started
    first_commit_s: float | None = None  # time.time() of the first epoch this tenure committed
    ended: str | None = None  # why it ended (None: still leading)
    recovered: dict[str, int] = field(default_factory=dict)  # sink -> rows applied at takeover
    sessions_ended: int = 0
    steps: dict[str, float] = field(default_factory=dict)  # takeover step -> seconds


class Heartbeat(threading.Thread):
    """Renews the lease every ``every_s`` while we lead; sets ``lost`` when it cannot."""

    def __init__(self, lease: Lease, every_s: float) -> None:
        super().__init__(name=f"reconcile-lease-{lease.pipeline}", daemon=True)
        self.lease, self.every_s = lease, every_s
        self.lost = threading.Event()
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(self.every_s):
            try:
                renewed = self.lease.renew()
            except Exception as exc:
                # No answer (a timeout, a lost connection), or one we cannot
                # use: we may still hold the lease, but held() turns false on
                # our own clock once the term is over. A renewal that hangs
                # outright never returns here: HaNode checks held() itself.
                log.warning("pipeline %s: lease not renewed: %s", self.lease.pipeline, exc)
                renewed = self.lease.held()
            if not renewed:
                self.lost.set()
                return


@dataclass(frozen=True)
class AfterFailure:
    """What a failed query calls for.

    ``action``: "step_down" (fenced: another writer leads), "stop" (for good:
    ``run()`` raises ``error``) or "restart" (the query again after
    ``wait_s``). ``reason`` is the step-down's (``ha.step_downs``).
    """

    action: Literal["step_down", "stop", "restart"]
    reason: str = ""
    error: BaseException | None = None
    wait_s: float = 0.0


class QueryFailures:
    """Counts the failures of one epoch in a row and decides what each one calls for.

    Args:
        pipeline: for the messages.
        limit: failures of one epoch in a row after which the node stops.
        max_wait_s: the longest wait before the query runs again.
    """

    def __init__(
        self, pipeline: str, *, limit: int = QUERY_FAILURES, max_wait_s: float = RESTART_WAIT_MAX_S
    ) -> None:
        self.pipeline, self.limit, self.max_wait_s = pipeline, limit, max_wait_s
        self.epoch: int | None = None
        self.failures = 0

    def committed(self) -> None:
        """An epoch went in: whatever failed before has passed."""
        self.epoch, self.failures = None, 0

    def decide(
        self, error: BaseException | None, epoch: int | None, said: str, poll_s: float
    ) -> AfterFailure:
        """What the query's failure calls for.

        Args:
            error: the typed error the writer kept (None: the query failed
                outside its batch function, in Spark itself).
            epoch: the epoch it failed at (None: not known).
            said: one line of what failed, for the messages.
            poll_s: the node's poll interval: the first wait is twice it.

        The cases (``reconcile.core.decisions.classify``):

        - fenced: step down; a newer writer leads;
        - rejected by the database, or an error no retry cures: stop; the
          same epoch would fail the same way after any restart or takeover;
        - anything else: run the query again after a wait that doubles with
          each failure of the epoch, up to ``max_wait_s``; at ``limit``
          failures of that epoch in a row, stop with a FatalError naming it.
        """
        verdict = classify(error)
        if verdict is Failure.FENCED:
            return AfterFailure("step_down", "fenced")
        if error is not None and verdict in (Failure.REJECTED, Failure.TERMINAL):
            reason = "rejected" if verdict is Failure.REJECTED else "error"
            return AfterFailure("stop", reason, error)
        self.failures = self.failures + 1 if self.epoch == epoch else 1
        self.epoch = epoch
        log.warning("pipeline %s: the query failed at epoch %s (%d in a row): %s",
                    self.pipeline, epoch, self.failures, said)  # fmt: skip
        if self.failures >= self.limit:
            gave_up = FatalError(
                f"pipeline {self.pipeline}: epoch {epoch} failed {self.failures} times in a "
                f"row; stopping. Last error: {said}",
                epoch=epoch,
            )
            return AfterFailure("stop", "query failing", gave_up)
        return AfterFailure("restart", wait_s=min(poll_s * 2**self.failures, self.max_wait_s))
