"""The steps both Delta sinks take alike: an epoch the log already holds, an abort, recover.

The delta-rs sink (``sinks.delta.sink``) and the delta-spark sink
(``sinks.delta_spark.sink``) differ in how they make an epoch visible, not in
how they read the log's tokens around it. What the log says decides, in one
place for both:

- a commit of an epoch the log records for this writer only tidies up;
  for another writer's log it is refused (``commit_owner_outcome``);
- a commit of an epoch older than the log's high-water mark is refused;
- an abort never discards a committed epoch, nor a newer writer's prepare;
- recover reports what is prepared and not in the log.

What "tidy up" deletes is the sink's own: the delta-rs sink's staged files
ARE the table's data files (its commit adds them), so it drops the manifest
only; the delta-spark sink's staged file is a copy its command read, so it
drops both.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypedDict

from deltalake import DeltaTable

from reconcile.core.contract import OK, Fatal, SinkOutcome, SinkTxnId
from sinks.delta.manifest import commit_owner_outcome
from sinks.delta.prepared import PreparedArea
from sinks.delta.tokens import epoch_app_id, is_committed, open_table
from sinks.ownership import WriterBinding

__all__ = ["Owner", "Settle", "abort_epoch", "epoch_in_log", "ready_to_commit", "stranded"]

# Drops what a committed (or aborted) epoch left in the prepared area.
Settle = Callable[[SinkTxnId], None]


class Owner(TypedDict):
    """Who commits, as the steps take it: the sink's name, its table, the writer it serves."""

    sink: str
    uri: str
    binding: WriterBinding


def epoch_in_log(
    table: DeltaTable | None,
    txn_id: SinkTxnId,
    where: str,
    *,
    sink: str,
    uri: str,
    binding: WriterBinding,
) -> SinkOutcome | None:
    """None if ``txn_id``'s epoch is not in the log; OK if it is, for this writer's log.

    Fatal if another writer's log committed it: answering OK would let this
    writer believe rows it never decided are its own (``commit_owner_outcome``).
    ``where`` ("prepare", "commit") names the step in the message.
    """
    if table is None or not is_committed(table, txn_id):
        return None
    foreign = commit_owner_outcome(
        table, epoch_app_id(txn_id), txn_id, where, sink=sink, uri=uri, binding=binding
    )
    return OK if foreign is None else foreign


def ready_to_commit(
    table: DeltaTable | None,
    txn_id: SinkTxnId,
    *,
    sink: str,
    uri: str,
    binding: WriterBinding,
    settle: Settle,
) -> SinkOutcome | None:
    """The start of both sinks' commit(): None when the epoch may be committed now.

    Otherwise the outcome to return: OK for an epoch already in (after
    ``settle``), Fatal for another writer's epoch or one older than the mark.
    """
    done = epoch_in_log(table, txn_id, "commit", sink=sink, uri=uri, binding=binding)
    if done is not None:
        if done is OK:
            # WHY: committed before (the ack was lost, a replay, or a recovering
            # writer settling a stale writer's leftover): only tidy up.
            settle(txn_id)
        return done
    last = None if table is None else table.transaction_version(epoch_app_id(txn_id))
    if last is not None and last > txn_id.epoch:
        # WHY: the token is a high-water mark. Recording an older epoch after a
        # newer one would move it backwards (delta-rs) or be skipped silently
        # by Delta (delta-spark's txnVersion): either way an epoch is lost.
        return Fatal(
            f"sink {sink!r}, {txn_id}: epoch {txn_id.epoch} is older than committed "
            f"epoch {last}; committing it would reorder epochs; nothing was written"
        )
    return None


def abort_epoch(
    area: PreparedArea, uri: str, txn_id: SinkTxnId, *, sink: str, settle: Settle
) -> SinkOutcome:
    """Drop ``txn_id``'s prepared epoch: the manifest first, then its files."""
    table = open_table(uri)
    if table is not None and is_committed(table, txn_id):
        settle(txn_id)
        return Fatal(f"sink {sink!r}, {txn_id}: abort of a committed txn; data stays")
    # WHY: a stale writer's abort must not discard a newer writer's prepared
    # batch of the same epoch (manifests and files are keyed by epoch only).
    if area.newer_holder(txn_id):
        return OK  # nothing of this txn is prepared
    # Manifest first: once it is gone the txn is no longer prepared, and a crash
    # before the files are deleted leaves an orphan folder that recover() still
    # reports, so a later abort finishes the job.
    area.remove(txn_id)
    area.drop_files(txn_id)
    return OK


def stranded(area: PreparedArea, uri: str, *, settle: Settle) -> Sequence[SinkTxnId]:
    """Txns prepared (manifest or leftover files) whose epoch the log does not record."""
    table = open_table(uri)
    found = []
    for txn in area.listed().values():
        if table is not None and is_committed(table, txn):
            # WHY: the log says it is in; a crash came between the commit and
            # the tidy-up: the leftovers are only leftovers.
            settle(txn)
            continue
        found.append(txn)
    return sorted(found)
