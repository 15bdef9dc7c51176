"""The writer fence of a Postgres sink: one row per (pipeline, sink), checked in every write.

Every epoch txn (and every repair) locks the fence row and compares its
generation with the writer's: an older writer is refused inside its own txn,
a newer one raises the fence there and takes over. A writer that takes over
eagerly (an HA takeover) raises it at once, waiting for an older writer's open
or prepared epoch txn, which holds the row locked. A fence row of another
progress log is never taken: it is a MarkerMismatchError (``ownership.py``).
"""

from __future__ import annotations

from typing import Any

import psycopg

from reconcile.core.contract import Fatal, FencedError, SinkTxnId

from .markers import Fence, StateTables
from .ownership import Scope, check_fence

__all__ = ["check_epoch_fence", "claim_fence_row", "take_over"]


def claim_fence_row(conn: psycopg.Connection[Any], state: StateTables, scope: Scope) -> None:
    """Claim the fence row of (pipeline, sink) for ``scope``'s log, outside any epoch txn.

    Raises:
        MarkerMismatchError: another progress log holds it.
    """
    conn.autocommit = True
    try:
        fence = state.ensure(conn, scope.pipeline, scope.sink, scope.log_id)
    finally:
        conn.autocommit = False
    mismatch = check_fence(fence, scope, state)
    if mismatch is not None:
        raise mismatch


def check_epoch_fence(
    cur: psycopg.Cursor[Any],
    state: StateTables,
    scope: Scope,
    txn_id: SinkTxnId,
    fence: Fence | None,
) -> Fatal | None:
    """Reject a stale writer (or another state) inside the txn; take over if we are newer.

    ``fence`` is the row as the txn's first statement locked it (None: missing).
    """
    if fence is not None and (mismatch := check_fence(fence, scope, state)):
        return Fatal.of(mismatch)
    if fence is not None and fence.generation == txn_id.generation:
        return None
    if fence is None or fence.generation < txn_id.generation:
        fence = state.raise_fence(cur, txn_id.pipeline, scope.sink, txn_id.generation, scope.log_id)
        if fence is not None and (mismatch := check_fence(fence, scope, state)):
            return Fatal.of(mismatch)
        if fence is not None and fence.generation == txn_id.generation:
            return None
    return Fatal.of(
        FencedError(
            f"postgres sink {scope.sink!r}: writer generation {txn_id.generation} is "
            f"fenced off by generation {fence.generation if fence else None} for epoch "
            f"{txn_id.epoch}; nothing was written (a newer writer has taken over)",
            generation=txn_id.generation,
            fence=fence.generation if fence else None,
        )
    )


def take_over(
    conn: psycopg.Connection[Any],
    state: StateTables,
    scope: Scope,
    generation: int,
    lock_timeout_ms: int,
) -> None:
    """Raise the fence of ``scope`` to ``generation`` now, in one txn on ``conn``.

    Raises:
        FencedError: a newer generation already holds the fence.
        MarkerMismatchError: another progress log holds the fence row.
        psycopg.Error: the wait for the row's lock timed out, or the connection failed.
    """
    conn.execute("SELECT set_config('lock_timeout', %s, true)", (str(int(lock_timeout_ms)),))
    with conn.cursor() as cur:
        current = state.raise_fence(cur, scope.pipeline, scope.sink, generation, scope.log_id)
    conn.commit()
    if current is not None and (mismatch := check_fence(current, scope, state)):
        raise mismatch
    if current is None or current.generation != generation:
        raise FencedError(
            f"postgres sink {scope.sink!r}: cannot take over with generation {generation}: "
            f"the fence is already at generation {current.generation if current else None}",
            generation=generation,
            fence=current.generation if current else None,
        )
