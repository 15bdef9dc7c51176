"""The Delta sink's tokens in its table's log: which epoch is in, which generation holds the table.

Every commit of the sink carries two app transactions: ``"<pipeline>/<sink>"``
at the epoch (the idempotency token) and ``"<pipeline>/<sink>#generation"`` at
the writer's generation (the fence). These functions read them from a
snapshot, and record a newer generation before it prepares.
"""

from __future__ import annotations

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from expected_state.delta_commit import BasedOn, DeltaCommit, commit_files
from expected_state.fencing import fence_app_id
from reconcile.core.contract import Fatal, FencedError, SinkOutcome, SinkTxnId
from sinks.delta.manifest import reconcile_fields
from sinks.delta.rows import data_schema_is_empty, state_schema

__all__ = [
    "claim_generation", "epoch_app_id", "fence_id", "fence_refusal", "is_committed", "open_table",
]  # fmt: skip


def open_table(uri: str) -> DeltaTable | None:
    """The sink's table at its newest version; None before its first commit."""
    try:
        return DeltaTable(uri)
    except TableNotFoundError:
        return None


def epoch_app_id(txn_id: SinkTxnId) -> str:
    """The app id of the epoch token: one per (pipeline, sink)."""
    return f"{txn_id.pipeline}/{txn_id.sink}"


def fence_id(txn_id: SinkTxnId) -> str:
    """The app id of the writer's generation (the fence)."""
    return fence_app_id(txn_id.pipeline, txn_id.sink)


def fence_refusal(table: DeltaTable | None, txn_id: SinkTxnId, *, sink: str) -> SinkOutcome | None:
    """Fatal if a newer generation has committed to this table."""
    if table is None:
        return None
    newest = table.transaction_version(fence_id(txn_id))
    if newest is not None and newest > txn_id.generation:
        return Fatal.of(
            FencedError(
                f"sink {sink!r}, {txn_id}: fenced, generation {newest} has taken "
                "over; nothing was written",
                generation=txn_id.generation,
                fence=newest,
            )
        )
    return None


def claim_generation(
    uri: str,
    table: DeltaTable | None,
    txn_id: SinkTxnId,
    schema: pa.Schema,
    *,
    restate_epoch: bool = False,
) -> None:
    """Record a newer generation in the log before preparing, to fence older writers.

    A newer writer's prepare must already shut out a zombie, not only its
    commit: the generation token goes in with an empty Delta commit (no data),
    once per generation. Racing claims conflict on the shared token in delta-rs,
    so the loser re-checks the fence.

    ``restate_epoch`` (the delta-spark sink) records the epoch token again at
    its current value in the claim: a delta-spark commit carries only the
    epoch token (``txnAppId``), never the fence, so a zombie's command that
    read the table before this claim conflicts with it on that token
    (ConcurrentTransactionException) instead of landing after it.
    """
    recorded = None if table is None else table.transaction_version(fence_id(txn_id))
    if recorded is not None and recorded >= txn_id.generation:
        return
    if table is None and data_schema_is_empty(schema):
        return  # nothing to create the table with yet; the commit records it
    target = state_schema(table) if table is not None else schema
    current = None if table is None else table.transaction_version(epoch_app_id(txn_id))
    restated = [(epoch_app_id(txn_id), current)] if restate_epoch and current is not None else []
    claim = DeltaCommit(
        table_uri=uri,
        schema=target,
        app_id=fence_id(txn_id),
        version=txn_id.generation,
        fence=(fence_id(txn_id), txn_id.generation),  # never lowers the fence
        tokens=restated,
    )
    commit_files(claim, None if table is None else BasedOn(table))


def is_committed(table: DeltaTable, txn_id: SinkTxnId) -> bool:
    """Whether this exact epoch's commit is in the log (not just a newer one)."""
    app_id = epoch_app_id(txn_id)
    last = table.transaction_version(app_id)
    if last is None or last < txn_id.epoch:
        return False
    if last == txn_id.epoch:
        return True
    # An older epoch than the high-water mark: look for its own commit.
    return any(
        c.get("reconcile.app_id") == app_id and c.get("reconcile.version") == txn_id.epoch
        for c in map(reconcile_fields, table.history())
    )
