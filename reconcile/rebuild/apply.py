"""A rebuild's apply: the rows two store versions differ by, into the sink, in bounded parts.

The store was rebased (``expected_state.rebasing``): the version before holds
the old logic's state, the version after the new one's, both as of the same
epoch. What the sink must change is the difference of the two, which is
taken from the store alone; the sink held the old state (the rebuild brought
it there before the rebase, as a takeover does).

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
from expected_state.store import ExpectedStateStore
from reconcile.core import hooks
from reconcile.core.contract import RetryableError
from reconcile.core.target import PullableSink, Repair
from reconcile.recovery import diff_tables
from reconcile.recovery.source import semi

__all__ = ["DEFAULT_PART_ROWS", "PART_APPLIED", "Applied", "Rebased", "apply_rebase",
           "rebuild_mode"]  # fmt: skip

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
class Rebased:
    """A store table's rebase, as the apply takes it.

    Attributes:
        before: the store's Delta version before the rebase (the old state).
        after: the rebase's Delta version (the new state).
        epoch: the epoch both states are as of; the sink's newest marker.
        mode: what each part's repairs row records (``rebuild_mode``).
    """

    before: int
    after: int
    epoch: int
    mode: str


def apply_rebase(
    sink: PullableSink,
    store: ExpectedStateStore,
    generation: int,
    rebased: Rebased,
    part_rows: int = DEFAULT_PART_ROWS,
    on_part: Callable[[int, int], None] | None = None,
) -> Applied:
    """Apply to ``sink`` what store version ``rebased.after`` changed from ``before``, in parts.

    Args:
        sink: the sink table's pullable client, bound to the pipeline's writer.
        store: its store table.
        generation: the writer generation of the rebuild.
        rebased: the two store versions, their epoch, and the mode to record.
        part_rows: rows per transaction.
        on_part: called with (parts done, parts in all) after each part.

    Raises:
        FencedError: a newer writer holds the sink.
        RetryableError: an epoch committed in the sink since (no writer should:
            the rebuild holds the fence), or the database failed.
    """
    keys = store.key_columns
    epoch, mode = rebased.epoch, rebased.mode
    old, new = store.state_at_version(rebased.before), store.state_at_version(rebased.after)
    hashed = [*keys, ROW_HASH_COLUMN]
    diff = diff_tables(new.select(hashed), old.select(hashed), keys)
    wanted = pa.concat_tables([diff.missing, diff.changed])
    assert store.user_schema is not None
    names = store.user_schema.names
    upserts = semi(new, wanted, keys).select(names) if wanted.num_rows else new.slice(0, 0)
    upserts = upserts.select(names)
    deletes = diff.extra.select(keys)
    step = max(1, part_rows)
    total = max(1, -(-(upserts.num_rows + deletes.num_rows) // step))
    target = sink.recovery_target(sink.pipeline or store.pipeline, generation, write=True)
    counts = diff.counts
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
