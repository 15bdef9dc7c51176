"""A rebuild's apply: the rows the new state differs by, into the sink, in bounded parts.

What the sink must change is what the store's rebase changed
(``expected_state.rebasing``): the difference ``prepare_rebase`` found, or,
for a rebuild resumed after its process died, the difference of the store's
versions before and after the rebase. It is taken from the store alone; the
sink held the old state (the rebuild brought it there before the rebase, as a
takeover does).

Each part is ONE sink transaction through the sink's recovery target, exactly
as a repair: the fence row locked and checked (a newer writer makes it fail),
the newest marker re-checked (an epoch that committed since makes it give
up), the rows deleted and upserted with ``_epoch`` = the rebuild's epoch, and
a ``reconcile_repairs`` row whose ``mode`` names the rebuild and its logic
version, written in the same transaction. A part killed before its COMMIT
leaves nothing; the parts before it stay. A rebuild that was killed while it
applied does not trust which parts landed: its resume converges the sink by
a full pull-and-diff instead (``reconcile.rebuild.run``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]

from expected_state.layout import ROW_HASH_COLUMN
from expected_state.rebasing import Rebase
from expected_state.store import ExpectedStateStore
from reconcile.core import hooks
from reconcile.core.contract import RetryableError
from reconcile.core.target import PullableSink, Repair
from reconcile.recovery import diff_tables
from reconcile.recovery.source import semi

__all__ = ["DEFAULT_PART_ROWS", "PART_APPLIED", "Applied", "Difference", "apply_difference",
           "difference_of", "difference_of_versions", "rebuild_mode"]  # fmt: skip

log = logging.getLogger("reconcile.rebuild")

# After each part's COMMIT returned.
PART_APPLIED = hooks.declare("rebuild.part.applied")

# Rows (upserted or deleted) per sink transaction: each holds its row locks
# and its WAL until it commits, so a part stays small next to the table.
DEFAULT_PART_ROWS = 50_000


def rebuild_mode(rebuild: str, logic_version: str) -> str:
    """The ``mode`` a rebuild's sink transactions record: the rebuild and its logic."""
    return f"rebuild {rebuild} logic {logic_version}"


@dataclass(frozen=True)
class Applied:
    """What the apply wrote into one sink table."""

    upserted: int
    deleted: int
    parts: int

    @property
    def rows(self) -> int:
        """Every row written or deleted."""
        return self.upserted + self.deleted


@dataclass(frozen=True)
class Difference:
    """What a sink table must change: the rows to upsert and the keys to delete.

    Attributes:
        upserts: the new rows (user columns) of the keys inserted or changed.
        deletes: the key columns of the keys to delete.
        counts: missing (inserted), extra (deleted) and changed, for the record.
        epoch: the epoch both states are as of; the sink's newest marker.
        mode: what each part's repairs row records (``rebuild_mode``).
    """

    upserts: pa.Table
    deletes: pa.Table
    counts: dict[str, int]
    epoch: int
    mode: str


def difference_of(rebase: Rebase, mode: str) -> Difference:
    """The difference a store's rebase found (``prepare_rebase``), as the sink takes it."""
    counts = {"missing": rebase.inserted.num_rows, "extra": rebase.deletes.num_rows,
              "changed": rebase.changed.num_rows}  # fmt: skip
    return Difference(rebase.upserts, rebase.deletes, counts, rebase.through, mode)


def difference_of_versions(
    store: ExpectedStateStore, before: int, after: int, epoch: int, mode: str
) -> Difference:
    """What store version ``after`` changed from ``before``: both states read whole.

    For a rebuild resumed after its process died with the store rebased: the
    difference it found then is gone with it.
    """
    keys = store.key_columns
    with store.holding():  # both versions held from vacuum while they are read
        old, new = store.state_at_version(before), store.state_at_version(after)
    hashed = [*keys, ROW_HASH_COLUMN]
    diff = diff_tables(new.select(hashed), old.select(hashed), keys)
    wanted = pa.concat_tables([diff.missing, diff.changed])
    assert store.user_schema is not None
    names = store.user_schema.names
    upserts = semi(new, wanted, keys).select(names) if wanted.num_rows else new.slice(0, 0)
    return Difference(upserts.select(names), diff.extra.select(keys), diff.counts, epoch, mode)


def apply_difference(
    sink: PullableSink,
    store: ExpectedStateStore,
    generation: int,
    difference: Difference,
    part_rows: int = DEFAULT_PART_ROWS,
    on_part: Callable[[int, int], None] | None = None,
) -> Applied:
    """Apply ``difference`` to ``sink`` in parts of ``part_rows`` rows, each one transaction.

    Args:
        sink: the sink table's pullable client, bound to the pipeline's writer.
        store: its store table.
        generation: the writer generation of the rebuild.
        difference: what to write, as of which epoch, and the mode to record.
        part_rows: rows per transaction.
        on_part: called with (parts done, parts in all) after each part.

    Raises:
        FencedError: a newer writer holds the sink.
        RetryableError: an epoch committed in the sink since (no writer should:
            the rebuild holds the fence), or the database failed.
    """
    upserts, deletes = difference.upserts, difference.deletes
    epoch, mode, counts = difference.epoch, difference.mode, difference.counts
    step = max(1, part_rows)
    total = max(1, -(-(upserts.num_rows + deletes.num_rows) // step))
    target = sink.recovery_target(sink.pipeline or store.pipeline, generation, write=True)
    done = 0
    # Deletes first, in their own parts: a key the new logic moved (deleted
    # under one key, inserted under another) never collides with a unique
    # value it still holds.
    for table, is_delete in ((deletes, True), (upserts, False)):
        for start in range(0, table.num_rows, step):
            chunk = table.slice(start, step)
            repair = Repair(
                upserts=upserts.slice(0, 0) if is_delete else chunk,
                deletes=chunk if is_delete else deletes.slice(0, 0),
                target_epoch=epoch,
                seen_newest=epoch,
                counts=counts if done == 0 else {},
                mode=mode,
            )
            if target.apply(repair) is None:
                raise RetryableError(
                    f"rebuild of {target.display}: an epoch committed in the sink while the "
                    "rebuild held its fence; nothing of this part was written"
                )
            done += 1
            hooks.point(PART_APPLIED)
            if on_part is not None:
                on_part(done, total)
    log.info("rebuild of %s: %d upserted, %d deleted in %d transactions", target.display,
             upserts.num_rows, deletes.num_rows, done)  # fmt: skip
    return Applied(upserts.num_rows, deletes.num_rows, done)
