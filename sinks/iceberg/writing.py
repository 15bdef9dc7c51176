"""The Iceberg sink's catalog commits: prepare's record, commit's snapshot, abort's removal.

Each is committed through ``committing.commit_rebasing``: its checks run on
the base its commit requires (``tokens.commit_once``), again on every new
base after a lost race, so that a co-writer committing all the time cannot
starve the sink, and a takeover between two attempts is always seen.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
from pyiceberg.table import Table
from pyiceberg.table.update import RemovePropertiesUpdate, SetPropertiesUpdate

from reconcile.core import hooks
from reconcile.core.contract import OK, Fatal, Ok, SinkOutcome, SinkTxnId
from sinks.iceberg import prepared as records
from sinks.iceberg.committing import Staged, commit_rebasing
from sinks.iceberg.fence import committed_outcome, fence_refusal, tidy
from sinks.iceberg.rebase import Carry, rebase_onto
from sinks.iceberg.rewrite import Rewrite, plan_rewrite, remove_files, stage_snapshot
from sinks.iceberg.tokens import (
    KIND_CLAIM,
    SinkKeys,
    epoch_summary,
    int_property,
    new_transaction,
)
from sinks.ownership import foreign_prepare

if TYPE_CHECKING:
    from sinks.iceberg.sink import IcebergSink

__all__ = ["COMMIT_CHECKED", "abort_record", "commit_intent", "record_intent"]

# Between commit()'s checks on a base (record, fence, order) and its catalog commit on it.
COMMIT_CHECKED = hooks.declare("iceberg_sink.commit.checked")


def record_intent(
    sink: IcebergSink, table: Table, txn_id: SinkTxnId, intent: pa.Table
) -> SinkOutcome:
    """Write the intent file, then record it: one commit, rebased until it lands or is refused."""
    keys, binding = SinkKeys.of(txn_id), sink._binding
    old = records.read_record(table, keys, txn_id.epoch)
    path = records.write_intent(table, txn_id, intent) if intent.num_rows else None
    record = records.PreparedRecord(txn_id, path, binding.log_id)
    body = records.record_body(txn_id, path, record.log_id)

    def stage(base: Table) -> Staged | SinkOutcome:
        # What prepare() checked, again on this base: the epoch not in, not fenced.
        done = committed_outcome(base, txn_id, "prepare", binding, sink.display)
        if done is not None:
            return done
        if (fenced := fence_refusal(base, txn_id, sink.display, binding)) is not None:
            return fenced
        properties = {keys.prepared(txn_id.epoch): body}
        transaction = new_transaction(base)
        fence = int_property(base, keys.generation)
        if fence is None or fence < txn_id.generation:
            # The claim: a newer generation raises the fence AND moves main (an
            # empty snapshot), so every commit a stale writer planned before
            # this fails the catalog's assert-ref-snapshot-id (tokens.py).
            properties[keys.generation] = str(txn_id.generation)
            claim = epoch_summary(txn_id, binding.log_id, kind=KIND_CLAIM)
            with transaction.update_snapshot(snapshot_properties=claim).fast_append():
                pass
        return Staged(transaction, (SetPropertiesUpdate(updates=properties),))

    outcome = commit_rebasing(table, sink.table, stage, display=sink.display,
                              what=f"Iceberg sink {sink.name!r}, prepare of {txn_id}")  # fmt: skip
    if not isinstance(outcome, Ok):
        records.delete_intent(table, record)  # nothing names it
        return outcome
    if old is not None and old.intent != path:
        records.delete_intent(table, old)  # prepared again: the new intent replaces it
    return OK


def _checked_record(
    sink: IcebergSink, base: Table, txn_id: SinkTxnId
) -> records.PreparedRecord | SinkOutcome:
    """What commit() relies on, read from ``base``: the record, or the outcome to stop with.

    Committed before (the reply was lost, a replay, or a recovering writer
    settling a stale writer's leftover): OK after tidying up. Fenced, an
    older epoch than the newest, no record, another log's record: Fatal.
    """
    binding, keys = sink._binding, SinkKeys.of(txn_id)
    done = committed_outcome(base, txn_id, "commit", binding, sink.display)
    if done is not None:
        if done:
            tidy(base, txn_id)
        return done
    if (fenced := fence_refusal(base, txn_id, sink.display, binding)) is not None:
        return fenced
    newest = int_property(base, keys.epoch)
    if newest is not None and newest > txn_id.epoch:
        # The high-water mark must never move back: an older epoch after a
        # newer one would make the newer one look uncommitted.
        return Fatal(f"Iceberg sink {sink.name!r}, {txn_id}: epoch {txn_id.epoch} is older "
                     f"than committed epoch {newest}; committing it would reorder epochs; "
                     "nothing was written")  # fmt: skip
    record = records.read_record(base, keys, txn_id.epoch)
    if record is None:
        return Fatal(f"Iceberg sink {sink.name!r}, {txn_id}: commit of a txn that was "
                     "never prepared")  # fmt: skip
    if record.log_id != binding.log_id:
        return foreign_prepare(f"Iceberg sink {sink.name!r}", txn_id,
                               found_log=record.log_id, log_id=binding.log_id,
                               location=f"table property {keys.prepared(txn_id.epoch)!r} "
                               f"of {sink.display}")  # fmt: skip
    return record


def commit_intent(sink: IcebergSink, table: Table, txn_id: SinkTxnId) -> SinkOutcome:
    """Make the prepared intent visible as ONE snapshot tagged with the txn's epoch.

    The plan (the files to rewrite, and the new files written) is made on
    the first base, and kept with what its staging read while it still
    holds on the next ones (``rebase.rebase_onto``); else it is made again.
    Files of a plan that no snapshot names in the end are removed.
    """
    keys, binding = SinkKeys.of(txn_id), sink._binding
    planned: list[tuple[records.PreparedRecord, Rewrite]] = []
    stopped: list[SinkOutcome] = []
    carry = Carry()

    def drop_plan(base: Table) -> None:
        if planned:
            remove_files(base, [f.file_path for f in planned.pop()[1].added])

    def stage(base: Table) -> Staged | SinkOutcome:
        nonlocal carry
        record = _checked_record(sink, base, txn_id)
        if not isinstance(record, records.PreparedRecord):
            stopped.append(record)
            return record
        if planned and (
            planned[0][0] != record or not rebase_onto(carry, base, planned[0][1].prune)
        ):
            # Another record, or a base that changed more than by appends of
            # other keys: plan and stage again on this base.
            drop_plan(base)
            carry = Carry()
        if not planned:
            try:
                changes = records.read_intent(base, record)
            except FileNotFoundError:
                missing = Fatal(f"Iceberg sink {sink.name!r}, {txn_id}: the prepared intent "
                                f"file {record.intent!r} is missing (removed by hand, or by an "
                                "orphan-file clean-up); nothing was written")  # fmt: skip
                stopped.append(missing)
                return missing
            if changes is None:
                upserts = deletes = base.schema().as_arrow().empty_table()
            else:
                upserts, deletes = records.ops_of(changes)
            planned.append((record, plan_rewrite(base, upserts, deletes, sink.key_columns(base))))
        transaction = new_transaction(base)
        stage_snapshot(transaction, planned[0][1], epoch_summary(txn_id, binding.log_id), carry)
        fence = int_property(base, keys.generation) or 0
        properties = {keys.generation: str(max(fence, txn_id.generation)),
                      keys.epoch: str(txn_id.epoch)}  # fmt: skip
        if binding.log_id is not None:
            properties[keys.log_id] = binding.log_id
        hooks.point(COMMIT_CHECKED)
        return Staged(transaction, (
            SetPropertiesUpdate(updates=properties),
            RemovePropertiesUpdate(removals=[keys.prepared(txn_id.epoch)]),
        ))  # fmt: skip

    # Any exception but a lost race escapes: the outcome is unknown, and the
    # next commit() looks for the epoch's snapshot before anything else.
    outcome = commit_rebasing(table, sink.table, stage, display=sink.display,
                              what=f"Iceberg sink {sink.name!r}, commit of {txn_id}")  # fmt: skip
    if stopped or not isinstance(outcome, Ok):
        # Nothing of this commit landed: its files are named by no snapshot.
        drop_plan(table)
        return outcome
    records.delete_intent(table, planned[0][0])
    return OK


def abort_record(sink: IcebergSink, table: Table, txn_id: SinkTxnId) -> SinkOutcome:
    """Remove the epoch's prepared record (main required unchanged), then its intent file."""
    binding, keys = sink._binding, SinkKeys.of(txn_id)
    removed: list[records.PreparedRecord] = []

    def stage(base: Table) -> Staged | SinkOutcome:
        removed.clear()
        if committed_outcome(base, txn_id, "abort", binding, sink.display):
            tidy(base, txn_id)
            return Fatal(f"Iceberg sink {sink.name!r}, {txn_id}: abort of a committed txn; "
                         "data stays")  # fmt: skip
        record = records.read_record(base, keys, txn_id.epoch)
        if record is None:
            return OK
        if record.txn.generation > txn_id.generation:
            return OK  # a newer writer's prepared batch of the epoch: not ours to discard
        removed[:] = [record]
        removal = RemovePropertiesUpdate(removals=[keys.prepared(txn_id.epoch)])
        return Staged(new_transaction(base), (removal,))

    outcome = commit_rebasing(table, sink.table, stage, display=sink.display,
                              what=f"Iceberg sink {sink.name!r}, abort of {txn_id}")  # fmt: skip
    if isinstance(outcome, Ok) and removed:
        records.delete_intent(table, removed[0])
    return outcome
