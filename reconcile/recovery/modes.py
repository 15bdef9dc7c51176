"""How recovery finds what differs: the modes, and the auto decision as a pure function."""

from __future__ import annotations

import enum

__all__ = ["Mode", "choose_mode"]


class Mode(enum.Enum):
    """Which rows are pulled from the sink to be diffed.

    - FULL: every row.
    - SCOPED: only what could differ since the last verified epoch: the keys the
      expected state changed since then, and the sink rows whose ``_epoch`` is
      newer. Needs the sink's ``_epoch`` column. Costs in proportion to the
      divergence, not to the table.
    - BUCKETS: the sink's system computes a count and a checksum per bucket of
      keys, the expected side the same; only differing buckets are pulled.
      Finds any value changed by hand (the checksum is computed from the
      values, not read from a hash column the engine wrote). It gives way to
      FULL, on the same snapshot, when its first level's differing buckets
      hold more than ``BucketLimits.full_share`` of the rows (drift spread
      thin over the whole table): measured from the checksums just computed,
      going on would cost more than pulling every row.
    - AUTO: SCOPED after a crash, BUCKETS for a scheduled check (and so FULL
      where that costs less), FULL when nothing else applies.
    """

    FULL = "full"
    SCOPED = "scoped"
    BUCKETS = "buckets"
    AUTO = "auto"


def choose_mode(
    requested: Mode,
    *,
    after_crash: bool,
    epoch_column: bool,
    bucket_checksums: bool,
    verified_epoch: int | None,
    summary_kept: bool = False,
) -> tuple[Mode, str]:
    """The mode that runs, and why, for a requested mode (AUTO decides; others are kept).

    Args:
        requested: what the caller asked for.
        after_crash: recovery after a restart (the divergence is the epochs in
            doubt), rather than a scheduled check for drift of any kind.
        epoch_column: the sink's rows carry ``_epoch``.
        bucket_checksums: the sink's system computes bucket checksums.
        verified_epoch: the newest epoch up to which the sink is known to match
            the expected state (None: never verified).
        summary_kept: a bucket summary of the expected side is kept for these
            columns (``reconcile.recovery.summary``): only the database then
            scans the whole table. Without one, the first bucket check computes it
            from every expected row, at one to two full verifies' cost, and keeps it.
    """
    if requested is not Mode.AUTO:
        return requested, "requested"
    if after_crash and epoch_column and verified_epoch is not None:
        return Mode.SCOPED, (
            f"after a restart, the sink matched the expected state up to epoch "
            f"{verified_epoch}; only later epochs can differ, and rows carry _epoch"
        )
    if bucket_checksums:
        reason = "a check for drift of any kind (hand edits included)"
        if after_crash:
            reason = "no verified epoch to scope from" if epoch_column else "rows lack _epoch"
        # WHY buckets even without a kept summary: its first check costs one to two full
        # verifies (measured: 1.0-1.4x at TPC-H scale 1, 1.9x at scale 10, the row
        # checksums in Python) and leaves the summary, with which every later check
        # reads only the changes since (about 0.5x full at scale 10): a check that
        # recurs costs less from its third run on. Full mode would leave nothing.
        cost = (
            "a kept summary stands for the expected side, brought forward from the changes "
            "since its epoch, so only the database scans the whole table"
            if summary_kept
            else "no bucket summary is kept yet: this check computes it from every expected "
            "row, at one to two full verifies' cost, and keeps it for the checks after it"
        )
        return Mode.BUCKETS, (
            f"{reason}: compare bucket checksums, pull differing buckets (full mode where "
            f"they hold too many rows); {cost}"
        )
    return Mode.FULL, "the sink computes no bucket checksums and cannot be scoped"
