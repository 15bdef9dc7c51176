"""One catalog commit that other writers cannot starve: checked and staged again on each new base.

``tokens.commit_once`` commits on the snapshot the table was loaded at, and
fails (nothing written) if anything moved main since. Alone, it loses every
time to a co-writer that appends every few tens of milliseconds: each attempt
loads, checks and stages longer than the gap between two of the co-writer's
commits. So a lost commit is *rebased*:

1. the table is loaded again;
2. the operation's checks run again on that metadata: the fence, whether
   the epoch is in, the prepared record: everything its commit relies on;
3. its updates are staged again on that base (a plan that still holds is
   reused: see ``rewrite.still_valid``);
4. it is committed once more, requiring main to be that new snapshot.

The fence is never dropped on the way (pyiceberg's own retry drops the
requirement it failed on, which is why the sink does not use it): every
attempt's checks and its commit are on one base. A takeover that lands
between two attempts is seen by the next attempt's checks.

Backoff and bound: after the n-th lost race the writer waits a random time up
to ``min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2**n)`` ("full jitter": two writers
that lost together do not retry together), for at most ``ATTEMPTS`` attempts.
Past that, a Retryable naming the table and the races lost (nothing was
written): the cycle retries the operation, then stops the pipeline.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from pyiceberg.exceptions import CommitFailedException
from pyiceberg.table import Table, Transaction
from pyiceberg.table.update import TableUpdate

from reconcile.core.contract import OK, Fatal, Retryable, SinkOutcome
from sinks.iceberg.tokens import commit_once

__all__ = ["ATTEMPTS", "BACKOFF_FIRST_S", "BACKOFF_MAX_S", "Staged", "commit_rebasing"]

# Attempts of one operation's commit, each on the newest base; the waits
# between them add up to at most about 14 seconds (about 7 on average).
ATTEMPTS = 40
BACKOFF_FIRST_S = 0.005
BACKOFF_MAX_S = 0.4


@dataclass(frozen=True)
class Staged:
    """One attempt's updates, staged on the base they were checked on."""

    transaction: Transaction
    extra: tuple[TableUpdate, ...] = ()


def commit_rebasing(
    table: Table,
    load: Callable[[], Table | None],
    stage: Callable[[Table], Staged | SinkOutcome],
    *,
    what: str,
    display: str,
) -> SinkOutcome:
    """Commit what ``stage`` builds, rebasing it on the newest metadata each time it loses.

    Args:
        table: the table as the operation loaded it (the first base).
        load: loads the table again (None: it was dropped).
        stage: checks everything the commit relies on against the base it is
            given and returns an outcome to stop with (nothing is committed),
            or the updates staged on that base.
        what: the operation, for the message ("Iceberg sink 'orders', commit of ...").
        display: the table, for the message.

    Returns:
        OK once committed; ``stage``'s outcome when a check stops it; Fatal if
        the table was dropped; Retryable after ``ATTEMPTS`` lost races.

    Raises:
        Any exception but CommitFailedException (from the catalog): the
        outcome is unknown; the caller's next operation looks again.
    """
    started = time.monotonic()
    lost: CommitFailedException | None = None
    for attempt in range(ATTEMPTS):
        staged = stage(table)
        if not isinstance(staged, Staged):
            return staged
        try:
            commit_once(table, staged.transaction, staged.extra)
            return OK
        except CommitFailedException as exc:
            # Another commit moved main first: nothing of ours was written.
            lost = exc
        time.sleep(random.uniform(0, min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2**attempt)))
        reloaded = load()
        if reloaded is None:
            return Fatal(f"{what}: the table {display} was dropped; nothing was written")
        table = reloaded
    return Retryable(
        f"{what}: lost the race to commit to {display} {ATTEMPTS} times in a row over "
        f"{time.monotonic() - started:.1f} s (other writers commit to the table all the time); "
        f"nothing was written: {lost}"
    )
