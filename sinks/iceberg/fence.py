"""The Iceberg sink's decisions on one loaded metadata: is the epoch in, is the writer fenced.

Each answer is read from the metadata that the operation's commit will
require to be current (``tokens.commit_once``), so none of them is a
read-then-write: if the table moved, the commit fails and nothing is written.
"""

from __future__ import annotations

from pyiceberg.exceptions import CommitFailedException
from pyiceberg.table import Table
from pyiceberg.table.update import RemovePropertiesUpdate

from reconcile.core.contract import (
    OK,
    Fatal,
    FencedError,
    MarkerMismatchError,
    SinkOutcome,
    SinkTxnId,
)
from sinks.iceberg import prepared as records
from sinks.iceberg.tokens import (
    SinkKeys,
    commit_once,
    committed_snapshot,
    int_property,
    new_transaction,
)
from sinks.ownership import foreign_commit

__all__ = ["committed_outcome", "fence_refusal", "tidy"]


def fence_refusal(table: Table | None, txn_id: SinkTxnId, display: str) -> SinkOutcome | None:
    """Fatal if a newer generation than ``txn_id``'s holds the table; None otherwise."""
    if table is None:
        return None
    newest = int_property(table.metadata.properties, SinkKeys.of(txn_id).generation)
    if newest is not None and newest > txn_id.generation:
        return Fatal.of(
            FencedError(
                f"Iceberg sink {txn_id.sink!r} ({display}), {txn_id}: fenced, generation "
                f"{newest} has taken over; nothing was written",
                generation=txn_id.generation,
                fence=newest,
            )
        )
    return None


def committed_outcome(
    table: Table, txn_id: SinkTxnId, where: str, log_id: str | None, display: str
) -> SinkOutcome | None:
    """OK if the epoch is in for this writer's log, Fatal if for another's, None if not in.

    The cases:

    - no snapshot carries the epoch, and the high-water mark is below it: not
      in (None), the operation goes on;
    - a snapshot carries it, written for ``log_id``: it is in (OK), and a
      replay writes nothing;
    - a snapshot carries it for another progress log: Fatal
      (MarkerMismatchError), never "already committed";
    - the high-water mark is the epoch but its snapshot is gone (expired by
      snapshot maintenance): whose it was cannot be read, so Fatal too, never
      a guess.
    """
    snapshot = committed_snapshot(table.metadata, txn_id)
    keys = SinkKeys.of(txn_id)
    if snapshot is None:
        if int_property(table.metadata.properties, keys.epoch) == txn_id.epoch:
            return Fatal.of(MarkerMismatchError(
                f"Iceberg sink {txn_id.sink!r}, {where} of {txn_id}: {display} records epoch "
                f"{txn_id.epoch} as its newest, but no snapshot of main's history carries it "
                "(expired?), so which progress log wrote it cannot be read. The epoch is NOT "
                f"treated as committed and nothing was written. Compare the rows with _epoch = "
                f"{txn_id.epoch} to this pipeline's output before going on.",
                pipeline=txn_id.pipeline, sink=txn_id.sink, epoch=txn_id.epoch, log_id=log_id,
            ))  # fmt: skip
        return None
    summary = snapshot.summary
    found = None if summary is None else summary.get("reconcile.log-id")
    if found == log_id:
        return OK
    return foreign_commit(
        f"Iceberg sink {txn_id.sink!r}",
        txn_id,
        where,
        found_txn=str(None if summary is None else summary.get("reconcile.txn")),
        found_log=found,
        log_id=log_id,
        location=f"Iceberg table {display} (snapshot {snapshot.snapshot_id})",
        advice=(
            "to write this pipeline's epochs again, give it a new table (another table name "
            "or namespace): the table's history cannot be taken back."
        ),
    )


def tidy(table: Table, txn_id: SinkTxnId) -> None:
    """Remove a committed epoch's leftover prepared record and intent file (best effort).

    The epoch is in, so any record of it is a leftover whatever its
    generation: removing it cannot lose anything. A conflict leaves it for
    the next operation that finds it.
    """
    keys = SinkKeys.of(txn_id)
    record = records.read_record(table, keys, txn_id.epoch)
    if record is None:
        return
    try:
        removal = RemovePropertiesUpdate(removals=[keys.prepared(txn_id.epoch)])
        commit_once(table, new_transaction(table), (removal,))
    except CommitFailedException:
        return
    records.delete_intent(table, record)
