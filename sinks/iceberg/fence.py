"""The Iceberg sink's decisions on one loaded metadata: is the epoch in, is the writer fenced.

Each answer is read from the metadata that the operation's commit will
require to be current (``tokens.commit_once``), so none of them is a
read-then-write: if the table moved, the commit fails and nothing is written.

Whatever the metadata says is held to what the store decided before it is
believed (``reconcile.core.claims``): a snapshot of this writer's log that
claims an epoch, the newest-epoch property and the fence property are
records anyone who can write the table can write.
"""

from __future__ import annotations

from pyiceberg.exceptions import CommitFailedException
from pyiceberg.table import Table
from pyiceberg.table.update import RemovePropertiesUpdate

from reconcile.core.claims import Claim
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
from sinks.ownership import WriterBinding, foreign_commit

__all__ = ["committed_outcome", "fence_refusal", "tidy"]


def _what(txn_id: SinkTxnId, display: str) -> str:
    return f"Iceberg sink {txn_id.sink!r} ({display})"


def fence_refusal(
    table: Table | None, txn_id: SinkTxnId, display: str, binding: WriterBinding
) -> SinkOutcome | None:
    """Fatal if a newer generation than ``txn_id``'s holds the table; None otherwise.

    A fence newer than every generation the store granted is no writer's:
    it is refused as an untrusted record, not obeyed as a takeover.
    """
    if table is None:
        return None
    keys = SinkKeys.of(txn_id)
    newest = int_property(table, keys.generation)
    if newest is None or newest <= txn_id.generation:
        return None
    claim = Claim(txn_id.sink, _what(txn_id, display),
                  f"table property {keys.generation!r} of Iceberg table {display}", "fence",
                  None, generation=newest)  # fmt: skip
    if (untrusted := binding.untrusted(claim)) is not None:
        return untrusted
    return Fatal.of(
        FencedError(
            f"Iceberg sink {txn_id.sink!r} ({display}), {txn_id}: fenced, generation "
            f"{newest} has taken over; nothing was written",
            generation=txn_id.generation,
            fence=newest,
        )
    )


def committed_outcome(
    table: Table, txn_id: SinkTxnId, where: str, binding: WriterBinding, display: str
) -> SinkOutcome | None:
    """OK if the epoch is in for this writer, Fatal if its record is not trusted, None if not in.

    The cases:

    - the high-water mark is below the epoch: not in (None), the operation goes on;
    - the high-water mark claims an epoch the store has not decided: Fatal
      (UntrustedRecordError), whatever the history holds;
    - a snapshot carries the epoch (or a repair covers it), written for this
      writer's log, claiming only decided epochs and granted generations: it
      is in (OK), and a replay writes nothing;
    - such a snapshot claiming more than the store decided: Fatal
      (UntrustedRecordError), never "already committed";
    - a snapshot carries it for another progress log: Fatal
      (MarkerMismatchError), never "already committed";
    - the high-water mark is the epoch but its snapshot is gone (expired by
      snapshot maintenance): whose it was cannot be read, so Fatal too, never
      a guess.
    """
    log_id = binding.log_id
    keys = SinkKeys.of(txn_id)
    newest = int_property(table, keys.epoch)
    if newest is not None and newest >= txn_id.epoch:
        # Only a mark at or past the epoch says anything of it: a new epoch's
        # prepare and commit (the mark below it) ask the store nothing.
        mark = Claim(txn_id.sink, _what(txn_id, display),
                     f"table property {keys.epoch!r} of Iceberg table {display}", "newest epoch",
                     newest)  # fmt: skip
        if (untrusted := binding.untrusted(mark)) is not None:
            return untrusted
    record = committed_snapshot(table, txn_id)
    if record is None:
        if newest == txn_id.epoch:
            return Fatal.of(MarkerMismatchError(
                f"Iceberg sink {txn_id.sink!r}, {where} of {txn_id}: {display} records epoch "
                f"{txn_id.epoch} as its newest, but no snapshot of main's history carries it "
                "(expired?), so which progress log wrote it cannot be read. The epoch is NOT "
                f"treated as committed and nothing was written. Compare the rows with _epoch = "
                f"{txn_id.epoch} to this pipeline's output before going on.",
                pipeline=txn_id.pipeline, sink=txn_id.sink, epoch=txn_id.epoch, log_id=log_id,
            ))  # fmt: skip
        return None
    if record.log_id == log_id:
        untrusted = binding.untrusted(record.claim(txn_id.sink, _what(txn_id, display), display))
        return OK if untrusted is None else untrusted
    return foreign_commit(
        f"Iceberg sink {txn_id.sink!r}",
        txn_id,
        where,
        found_txn=str(record.txn),
        found_log=record.log_id,
        log_id=log_id,
        location=f"Iceberg table {display} (snapshot {record.snapshot.snapshot_id})",
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
