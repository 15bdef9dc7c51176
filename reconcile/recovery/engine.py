"""Pull, hash, diff, apply: bring one sink table to its expected state, in any mode.

The engine is written against ``RecoveryTarget`` (``target.py``), so the same
steps run on the Postgres fast path and on any SQLAlchemy database:

1. check the sink table's columns against the expected state's (a mismatch is
   an error naming the column, before anything is pulled);
2. open one consistent snapshot of the sink, which also reads its newest marker;
3. find what differs, by mode: every row (full); the keys the store changed
   since the newest marker plus the rows of later epochs (scoped); the key
   ranges whose checksums differ (buckets);
4. unless it is a dry run, apply the difference in ONE sink transaction with
   the marker of the target epoch; if an epoch committed meanwhile (the newest
   marker moved), pull again.

The modes' work is in ``finding.py``. Each step is named for an interruption
(``reconcile.core.interrupts``): SIGINT or SIGTERM in "the pull", "the bucket
search", "the diff" or "the repair transaction" of a table says so.
"""

from __future__ import annotations

import logging
import time
from contextlib import nullcontext
from dataclasses import replace

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]

from reconcile.core import hooks, interrupts
from reconcile.core.claims import Claim, Decided, check_claim
from reconcile.core.conform import check_columns
from reconcile.core.contract import InvalidInputError, MassChangeError, RetryableError
from reconcile.core.expected import ExpectedStore
from reconcile.core.target import RecoveryTarget, Repair, RepairTurn, SinkSnapshot, repair_turn
from reconcile.recovery.brake import Brake, BrakeReading, counted_changes, refusal
from reconcile.recovery.buckets import BucketLimits
from reconcile.recovery.finding import Found, check_step, find_buckets, find_full, find_scoped
from reconcile.recovery.modes import Mode, choose_mode
from reconcile.recovery.options import MemoryKeywords, RecoverOptions
from reconcile.recovery.provenance import trace
from reconcile.recovery.report import ReconcileReport
from reconcile.recovery.source import ExpectedSource, semi
from reconcile.recovery.summary import load_summary

__all__ = ["PULLED", "ExpectedSource", "reconcile_table"]

log = logging.getLogger("reconcile.recovery")

# How often a repair pulls again because epochs kept committing meanwhile.
_MAX_ATTEMPTS = 5
# After the snapshot was pulled and diffed, before the repair's transaction: a
# running pipeline may commit an epoch here, which makes the diff stale.
PULLED = hooks.declare("recovery.pulled")


def reconcile_table(
    target: RecoveryTarget,
    store: ExpectedStore,
    options: RecoverOptions | None = None,
    *,
    bucket_options: BucketLimits | None = None,
) -> ReconcileReport:
    """Bring one sink table to the expected state (or, ``dry_run``, only measure the drift).

    Args:
        target: the sink table (see ``target.py``).
        store: its expected-state store table.
        options: how (``RecoverOptions``; what it says of the target, its keys,
            schema and sink name, was used to open ``target``): the mode (full,
            scoped, buckets, or auto, chosen by ``choose_mode``), ``after_crash``
            (auto then prefers scoped), the target epoch (default the store's
            newest), ``dry_run`` (report without writing), ``progress`` (called
            as rows are pulled, full mode), ``since_epoch`` (scoped mode's start,
            when earlier than the sink's newest marker: a scheduled check of the
            recent epochs) and the mass-change brake (``brake.py``; default 10 %,
            not lifted). Default: ``RecoverOptions()``.
        bucket_options: how far buckets mode cuts, and when full mode costs
            less (``BucketLimits``).

    Returns:
        The report: what was pulled and compared, what differed, what was applied.

    Raises:
        InvalidInputError: the table is not in the store, the schemas no longer
            match (the column is named), scoped mode on a sink without ``_epoch``
            or without a marker; nothing was written.
        StoreIntegrityError: the store holds what the engine did not write
            (StoreLostRowsError: it lost rows), naming the files and epochs;
            nothing was pulled or written.
        MassChangeError: the repair would delete or change more of the table
            than the brake allows; nothing was written.
        ConfigurationError: a mode or a brake fraction that is not one.
        RetryableError: epochs kept committing during every attempt.
        UntrustedRecordError: the sink records an epoch past the store's newest
            (``trust_newest``); nothing was pulled or written.
    """
    options = options or RecoverOptions()
    # A repair holds the table's turn from before its pull until it ends: a
    # second repair of the table waits here, then pulls what the first left,
    # and its report says that it waited. A verify writes nothing: no turn.
    # Every store version the verify or repair reads is held from the pipeline's
    # vacuum until it ends, however it ends (expected_state.holds).
    turn_of = nullcontext(RepairTurn()) if options.dry_run else repair_turn(target)
    with turn_of as turn, store.holding():
        report = _reconcile(target, store, options, bucket_options)
    if not turn.waited_s:
        return report
    return replace(report, repair_wait_s=turn.waited_s, repair_waited_for=turn.holder)


def _reconcile(
    target: RecoveryTarget,
    store: ExpectedStore,
    options: RecoverOptions,
    bucket_options: BucketLimits | None,
) -> ReconcileReport:
    """``reconcile_table``'s work, once the repair has its turn at the table."""
    mode, brake = options.chosen_mode(), options.brake()
    after_crash, target_epoch, dry_run = options.after_crash, options.target_epoch, options.dry_run
    progress, since_epoch = options.progress, options.since_epoch
    memory: MemoryKeywords = {"chunk_rows": options.chunk_rows, "spill_dir": options.spill_dir}
    started = time.monotonic()

    # Before anything is pulled: the store's commits must be the engine's. The
    # files each read uses are checked as they are read (their footers).
    store.audit()
    schema = store.user_schema
    keys = list(store.key_columns)
    last = store.last_epoch()
    if schema is None or last is None:
        raise InvalidInputError(
            f"table {target.display}: the expected-state store holds no epoch of it "
            f"(pipeline {getattr(store, 'pipeline', '?')!r}, table "
            f"{getattr(store, 'sink', '?')!r}); check --store, --pipeline and --table; "
            "nothing was pulled or written"
        )
    columns = target.columns()
    interrupts.name_table(target.display)
    check_columns(target.display, schema, columns, keys)
    source = ExpectedSource(store, values=not dry_run)
    sink_types = {name: col.kind for name, col in columns.items()}
    for _attempt in range(_MAX_ATTEMPTS):
        # The store's newest epoch, read again on each attempt: an epoch that
        # committed meanwhile was recorded in the store first.
        current = store.last_epoch() if target_epoch is None else target_epoch
        # The store held epoch ``last`` above, and its newest epoch only moves on.
        epoch = last if current is None else current
        with target.snapshot(schema, keys) as snap:
            newest = snap.newest_epoch
            trust_newest(target, store, newest)
            # Read once: on Delta and Iceberg it opens the table's metadata again.
            has_epoch = target.epoch_column
            checksums = target.bucket_checksums
            # The checksummed columns and their sink kinds, which key a kept summary; read
            # only where auto decides (a requested mode needs no reason), and only of a
            # sink that computes bucket checksums (a topic or an object store names its
            # columns otherwise, and keeps no summary).
            kept = (
                mode is Mode.AUTO
                and checksums
                and load_summary(
                    store, [(name, sink_types[name]) for name in schema.names], keys[0]
                )
                is not None
            )
            chosen, why = choose_mode(
                mode,
                after_crash=after_crash,
                epoch_column=has_epoch,
                bucket_checksums=checksums,
                verified_epoch=newest,
                summary_kept=kept,
            )
            if chosen is Mode.SCOPED:
                if not has_epoch:
                    raise InvalidInputError(
                        f"table {target.display} has no _epoch column, which scoped mode needs; "
                        "use mode full or buckets (or add the column: create_epoch_column=True)",
                        table=target.display,
                    )
                if newest is None:
                    raise InvalidInputError(
                        f"table {target.display}: scoped mode starts from the sink's newest "
                        "marker, and it has none; use mode full or buckets",
                        table=target.display,
                    )
                # From the sink's newest marker, or from further back when asked:
                # an earlier start only widens the keys checked, never narrows them.
                since = min(newest, epoch)
                if since_epoch is not None:
                    since = min(since, since_epoch)
                found = find_scoped(snap, source, schema, keys, epoch, since)
            elif chosen is Mode.BUCKETS:
                if not target.bucket_checksums:
                    raise InvalidInputError(
                        f"table {target.display}: this database computes no bucket checksums "
                        "(buckets mode runs on PostgreSQL); use mode full or scoped"
                    )
                with check_step("the bucket search"):
                    found = find_buckets(snap, source, schema, keys, epoch, sink_types,
                                         bucket_options or BucketLimits(), memory)  # fmt: skip
                if found.dearer is not None:
                    # Going on would cost more than pulling every row: full
                    # mode on the same snapshot, and the report says so.
                    compared, differing = found.compared, found.differing
                    chosen, why = Mode.FULL, f"buckets mode gave way to full: {found.dearer}"
                    found = find_full(snap, source, schema, keys, epoch, progress, memory)
                    found.compared, found.differing = compared, differing
            else:
                found = find_full(snap, source, schema, keys, epoch, progress, memory)
            reading = _weigh(found, snap, chosen, store, newest, epoch, keys, brake)
            # Before any repair: who last wrote the differing rows, read in the
            # snapshot they were diffed in (a few rows by key, not the pull).
            traced = trace(snap, source, found.diff, found.expected, keys, epoch,
                           options.provenance_rows)  # fmt: skip
            warnings = tuple(snap.warnings)
        if reading.exceeded and not dry_run and not brake.allow_mass_change:
            raise MassChangeError(
                refusal(target.display, reading, found.diff.counts, brake, epoch),
                table=target.display,
                counted=reading.counted,
                limit=reading.limit,
                sink_rows=reading.table_rows,
                **found.diff.counts,
            )
        applied = 0
        behind = newest is None or newest < epoch
        if not dry_run and (not found.diff.empty or behind):
            hooks.point(PULLED)
            repair = _repair(source, found, epoch, newest, keys, chosen)
            # A signal in here rolls the transaction back; one that arrives
            # after its COMMIT was sent says so (sinks mark their commit point).
            with check_step("the repair transaction"):
                result = target.apply(repair)
            if result is None:
                continue  # an epoch committed since the pull: the diff is stale
            applied = result
        return ReconcileReport(
            table=target.display,
            mode=chosen.value,
            reason=why,
            target_epoch=epoch,
            rows_pulled=found.pulled,
            buckets_compared=found.compared,
            buckets_differing=found.differing,
            missing=found.diff.missing.num_rows,
            extra=found.diff.extra.num_rows,
            changed=found.diff.changed.num_rows,
            applied=applied,
            seconds=round(time.monotonic() - started, 6),
            dry_run=dry_run,
            brake_counted=reading.counted,
            brake_limit=reading.limit,
            sink_rows=reading.table_rows,
            mass_change=reading.exceeded,
            warnings=warnings,
            provenance=traced.rows,
            provenance_note=traced.note,
            foreign_writes=traced.foreign,
            foreign_rows=traced.foreign_rows,
            foreign_transactions=traced.foreign_transactions,
            scope=found.scope,
        )
    raise RetryableError(
        f"table {target.display}: epochs kept committing during {_MAX_ATTEMPTS} repair "
        "attempts (the newest marker moved each time); nothing was written, run it again"
    )


def trust_newest(target: RecoveryTarget, store: ExpectedStore, newest: int | None) -> None:
    """Refuse a sink whose records claim an epoch past the store's newest one.

    The sink's newest marker (snapshot, log entry) is what scoped mode starts
    from and what a repair must follow: a record someone else wrote claiming
    more than the store holds would narrow the pull and make a repair stand
    for epochs that never ran. Held to the store's newest epoch (which every
    decided epoch is recorded in before it reaches a sink) with the rule every
    sink uses (``reconcile.core.claims``); nothing is pulled or written.

    Raises:
        UntrustedRecordError: naming the table, the epoch it claims and the store's.
    """
    if newest is None:
        return
    claim = Claim(
        sink=store.sink,
        what=f"table {target.display}",
        record=f"the sink's newest record (epoch {newest})",
        kind="newest epoch",
        epoch=newest,
    )
    refused = check_claim(claim, Decided(store.last_epoch()))
    if refused is not None:
        raise refused


def _weigh(found: Found, snap: SinkSnapshot, mode: Mode, store: ExpectedStore, newest: int | None,
           epoch: int, keys: list[str], brake: Brake) -> BrakeReading:  # fmt: skip
    """What the brake counts in ``found``, and the table's rows when anything counts.

    Full mode pulled every row, so it knows the table's size; the other modes
    count it in the same snapshot, and only when there is something to weigh.
    """
    counted = counted_changes(found.diff, store, newest, epoch, keys)
    if counted == 0:
        return BrakeReading(0, None, None)
    rows = found.pulled if mode is Mode.FULL else snap.count_rows()
    return BrakeReading(counted, rows, brake.limit(rows))


def _repair(source: ExpectedSource, found: Found, epoch: int, newest: int | None,
            keys: list[str], mode: Mode) -> Repair:  # fmt: skip
    diff = found.diff
    # WHY the extra keys too: a key the sink holds twice is extra once and in the
    # expected state; a sink that deletes by key drops every copy of it, so its
    # expected row goes back in with the upserts (a key only the sink holds has
    # no expected row, and the semi-join leaves it out).
    wanted = pa.concat_tables([diff.missing, diff.changed, diff.extra])
    names = source.schema.names
    # The expected rows the diff compared carry the values when they were read
    # with them (scoped mode reads only its keys): no second read of the store.
    has_values = set(names) <= set(found.expected.column_names)
    expected = found.expected if has_values else source.rows(epoch)
    upserts = semi(expected, wanted, keys) if wanted.num_rows else expected.slice(0, 0)
    return Repair(
        upserts=upserts.select(names),
        deletes=diff.extra.select(keys),
        target_epoch=epoch,
        seen_newest=newest,
        counts=diff.counts,
        mode=mode.value,
    )
