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
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
import pyarrow.compute as pc  # type: ignore[import-untyped, unused-ignore]

from reconcile import hooks
from reconcile.contract import InvalidInputError, RetryableError
from reconcile.recovery.buckets import (
    BucketLimits,
    find_differing_ranges,
    search_from_summary,
    sort_expected,
)
from reconcile.recovery.conform import check_columns, conform, hash_pulled
from reconcile.recovery.diff import HASH, Diff, diff_tables
from reconcile.recovery.modes import Mode, choose_mode
from reconcile.recovery.report import ReconcileReport
from reconcile.recovery.summary import (
    BucketSummary,
    bring_forward,
    load_summary,
    rebalance,
    save_summary,
)
from reconcile.recovery.target import Progress, RecoveryTarget, Repair, SinkSnapshot

# The store's change-kind column (upsert or delete).
OP = "_op"

__all__ = ["PULLED", "ExpectedSource", "reconcile_table"]

log = logging.getLogger("reconcile.recovery")

# How often a repair pulls again because epochs kept committing meanwhile.
_MAX_ATTEMPTS = 5
# After the snapshot was pulled and diffed, before the repair's transaction: a
# running pipeline may commit an epoch here, which makes the diff stale.
PULLED = hooks.declare("recovery.pulled")


class ExpectedSource:
    """The expected state of one table at the target epoch, read lazily from the store.

    Args:
        store: an ``ExpectedStateStore`` (its public API: ``snapshot``,
            ``changed_keys``, ``last_epoch``, ``user_schema``, ``key_columns``).
    """

    def __init__(self, store: Any, *, values: bool = False) -> None:
        self.store = store
        # A repair needs the expected values of the keys it writes: read them in
        # the same pass as the hashes (one read of the store, not two).
        self.values = values
        self._full: dict[int, pa.Table] = {}

    def rows(self, epoch: int) -> pa.Table:
        """Keys, values and ``_row_hash`` of every expected row at ``epoch``."""
        if epoch not in self._full:
            names = [*self.store.user_schema.names, HASH]
            self._full[epoch] = self.store.snapshot(epoch, columns=names)
        return self._full[epoch]

    def hashes(self, epoch: int, keys: list[str]) -> pa.Table:
        """Keys and ``_row_hash`` at ``epoch`` (the full rows if already read)."""
        if self.values:
            self.rows(epoch)
        if epoch in self._full:
            return self._full[epoch].select([*keys, HASH])
        table: pa.Table = self.store.snapshot(epoch, columns=[*keys, HASH])
        return table

    def of_keys(self, epoch: int, keys: list[str], scope: pa.Table, since: int) -> pa.Table:
        """The expected rows of the keys in ``scope`` only, with values if a repair needs them.

        Scoped recovery's read, at a cost that follows the scope: a key changed
        in epochs ``(since, epoch]`` is at its newest change there, read from
        the change files only; only the other keys of the scope (sink rows of
        later epochs the store did not change: a run that was reverted) are
        looked up in a snapshot, which reads the base.
        """
        names = [*self.store.user_schema.names, HASH] if self.values else [*keys, HASH]
        try:
            newest = self.store.newest_changes(since, epoch, names)
        except InvalidInputError:
            # The change files after `since` are no longer all there (vacuum): the
            # snapshot of the scope, which time-travels, is still right.
            return self._snapshot_of(epoch, names, scope)
        scope_keys = scope.select(keys).cast(newest.select(keys).schema)
        newest = _semi(newest, scope_keys, keys)
        rest = scope_keys.join(newest.select(keys), keys=keys, join_type="left anti")
        upserts = newest.filter(pc.equal(newest.column(OP), "upsert")).select(names)
        if rest.num_rows == 0:
            return upserts
        return pa.concat_tables([upserts, self._snapshot_of(epoch, names, rest)])

    def _snapshot_of(self, epoch: int, names: list[str], scope: pa.Table) -> pa.Table:
        table: pa.Table = self.store.snapshot(epoch, columns=names, keys=scope)
        return table


@dataclass
class _Found:
    diff: Diff
    expected: pa.Table  # the expected rows compared (keys + hash, maybe values)
    pulled: int
    compared: int = 0
    differing: int = 0
    # Buckets mode stopped after its first level: why full mode costs less.
    dearer: str | None = None


def _semi(table: pa.Table, keys_table: pa.Table, keys: list[str]) -> pa.Table:
    """Rows of ``table`` whose key is in ``keys_table``."""
    if keys_table.num_rows == 0 or table.num_rows == 0:
        return table.slice(0, 0)
    wanted = keys_table.select(keys).cast(table.select(keys).schema)
    return table.join(wanted.group_by(keys).aggregate([]), keys=keys, join_type="left semi")


def _actual(raw: pa.Table, schema: pa.Schema, keys: list[str]) -> pa.Table:
    rows, bad = conform(raw, schema)
    return rows.select(keys).append_column(HASH, hash_pulled(rows, bad, schema.names))


def _full(snap: SinkSnapshot, source: ExpectedSource, schema: pa.Schema, keys: list[str],
          epoch: int, progress: Progress | None) -> _Found:  # fmt: skip
    expected = source.hashes(epoch, keys)
    raw = snap.pull_all(progress)
    return _Found(diff_tables(expected, _actual(raw, schema, keys), keys), expected, raw.num_rows)


def _scoped(snap: SinkSnapshot, source: ExpectedSource, schema: pa.Schema, keys: list[str],
            epoch: int, since: int) -> _Found:  # fmt: skip
    try:
        changed = source.store.changed_keys(since).select(keys)
    except InvalidInputError as err:
        raise InvalidInputError(
            f"scoped mode: the expected state cannot list the keys changed since the sink's "
            f"newest marker (epoch {since}): {err}; use mode full or buckets"
        ) from err
    raw = snap.pull_keys(changed, since)
    actual = _actual(raw, schema, keys)
    scope = pa.concat_tables([changed.cast(actual.select(keys).schema), actual.select(keys)])
    expected = source.of_keys(epoch, keys, scope, since)
    compared = expected.select([*keys, HASH])
    return _Found(diff_tables(compared, actual, keys), expected, raw.num_rows)


def _buckets(
    snap: SinkSnapshot,
    source: ExpectedSource,
    schema: pa.Schema,
    keys: list[str],
    epoch: int,
    sink_types: dict[str, str],
    limits: BucketLimits,
) -> _Found:
    snap.check_buckets()
    columns = [(name, sink_types[name]) for name in schema.names]
    store = source.store
    names = [*schema.names, HASH]
    searched = None

    def read(spans: list[tuple[Any, Any]]) -> pa.Table:
        if not spans:  # nothing differs: no need to read the store at all
            fields = [store.user_schema.field(c) for c in schema.names]
            return pa.schema([*fields, pa.field(HASH, pa.int64())]).empty_table()
        table: pa.Table = store.snapshot(epoch, columns=names, ranges=spans)
        return table

    kept = load_summary(store, columns, keys[0])
    summary = bring_forward(kept, store, epoch) if kept is not None else None
    if summary is not None:
        summary = rebalance(summary, read)
    if summary is not None and summary.bounds:
        searched = search_from_summary(
            snap,
            summary.bounds,
            summary.figures,
            lambda ranges: read([(r.lo, r.hi) for r in ranges]),
            columns,
            keys[0],
            limits,
        )
        if searched is None:
            log.warning("bucket summary of %s disagrees with the store: computed again", store.uri)
    if searched is not None:
        search, expected = searched
        if summary is not None and summary is not kept:
            save_summary(store, summary)
    else:
        expected = sort_expected(source.rows(epoch), keys[0])
        search = find_differing_ranges(snap, expected, columns, keys[0], limits)
        if search.top is not None:
            bounds, figures = search.top
            save_summary(
                store,
                BucketSummary(
                    epoch=epoch,
                    version=store.version_of(epoch),
                    first_key=keys[0],
                    columns=tuple(columns),
                    bounds=bounds,
                    rows=np.array([n for n, _ in figures], dtype=np.int64),
                    sums=np.array([c for _, c in figures], dtype=np.uint64),
                ),
            )
    if search.dearer is not None:
        nothing = pa.schema([store.user_schema.field(k) for k in keys]).empty_table()
        return _Found(Diff(nothing, nothing, nothing), nothing, 0, search.compared,
                      search.differing, search.dearer)  # fmt: skip
    # The leaves are pulled in one query: the round trips do not grow with the drift.
    raw = snap.pull_ranges([within for within, _, _ in search.leaves]) if search.leaves else None
    parts = [expected.slice(start, stop - start) for _, start, stop in search.leaves]
    compared = (
        pa.concat_tables(parts).select([*keys, HASH])
        if parts
        else expected.select([*keys, HASH]).slice(0, 0)
    )
    pulled = raw.num_rows if raw is not None else 0
    actual = _actual(raw, schema, keys) if pulled else compared.slice(0, 0)
    found = _Found(diff_tables(compared, actual, keys), compared, pulled)
    found.compared, found.differing = search.compared, search.differing
    return found


def reconcile_table(
    target: RecoveryTarget,
    store: Any,
    *,
    mode: Mode = Mode.AUTO,
    after_crash: bool = False,
    target_epoch: int | None = None,
    dry_run: bool = False,
    progress: Progress | None = None,
    bucket_options: BucketLimits | None = None,
    since_epoch: int | None = None,
) -> ReconcileReport:
    """Bring one sink table to the expected state (or, ``dry_run``, only measure the drift).

    Args:
        target: the sink table (see ``target.py``).
        store: its expected-state store table.
        mode: full, scoped, buckets, or auto (chosen by ``choose_mode``).
        after_crash: recovery after a restart (auto then prefers scoped).
        target_epoch: the epoch to compare with; default the store's newest.
        dry_run: report without writing.
        progress: called as rows are pulled (full mode).
        bucket_options: how far buckets mode cuts, and when full mode costs
            less (``BucketLimits``).
        since_epoch: scoped mode's start, when earlier than the sink's newest
            marker (a scheduled check of the recent epochs).

    Returns:
        The report: what was pulled and compared, what differed, what was applied.

    Raises:
        InvalidInputError: the table is not in the store, the schemas no longer
            match (the column is named), scoped mode on a sink without ``_epoch``
            or without a marker; nothing was written.
        RetryableError: epochs kept committing during every attempt.
    """
    started = time.monotonic()
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
    check_columns(target.display, schema, columns, keys)
    source = ExpectedSource(store, values=not dry_run)
    sink_types = {name: col.kind for name, col in columns.items()}
    for _attempt in range(_MAX_ATTEMPTS):
        # The store's newest epoch, read again on each attempt: an epoch that
        # committed meanwhile was recorded in the store first.
        epoch = store.last_epoch() if target_epoch is None else target_epoch
        with target.snapshot(schema, keys) as snap:
            newest = snap.newest_epoch
            chosen, why = choose_mode(
                mode,
                after_crash=after_crash,
                epoch_column=target.epoch_column,
                bucket_checksums=target.bucket_checksums,
                verified_epoch=newest,
            )
            if chosen is Mode.SCOPED:
                if not target.epoch_column:
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
                found = _scoped(snap, source, schema, keys, epoch, since)
            elif chosen is Mode.BUCKETS:
                if not target.bucket_checksums:
                    raise InvalidInputError(
                        f"table {target.display}: this database computes no bucket checksums "
                        "(buckets mode runs on PostgreSQL); use mode full or scoped"
                    )
                found = _buckets(snap, source, schema, keys, epoch, sink_types,
                                 bucket_options or BucketLimits())  # fmt: skip
                if found.dearer is not None:
                    # Going on would cost more than pulling every row: full
                    # mode on the same snapshot, and the report says so.
                    compared, differing = found.compared, found.differing
                    chosen, why = Mode.FULL, f"buckets mode gave way to full: {found.dearer}"
                    found = _full(snap, source, schema, keys, epoch, progress)
                    found.compared, found.differing = compared, differing
            else:
                found = _full(snap, source, schema, keys, epoch, progress)
            warnings = tuple(snap.warnings)
        applied = 0
        behind = newest is None or newest < epoch
        if not dry_run and (not found.diff.empty or behind):
            hooks.point(PULLED)
            repair = _repair(source, found, epoch, newest, keys, chosen)
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
            warnings=warnings,
        )
    raise RetryableError(
        f"table {target.display}: epochs kept committing during {_MAX_ATTEMPTS} repair "
        "attempts (the newest marker moved each time); nothing was written, run it again"
    )


def _repair(source: ExpectedSource, found: _Found, epoch: int, newest: int | None,
            keys: list[str], mode: Mode) -> Repair:  # fmt: skip
    diff = found.diff
    wanted = pa.concat_tables([diff.missing, diff.changed])
    names = source.store.user_schema.names
    # The expected rows the diff compared carry the values when they were read
    # with them (scoped mode reads only its keys): no second read of the store.
    has_values = set(names) <= set(found.expected.column_names)
    expected = found.expected if has_values else source.rows(epoch)
    upserts = _semi(expected, wanted, keys) if wanted.num_rows else expected.slice(0, 0)
    return Repair(
        upserts=upserts.select(names),
        deletes=diff.extra.select(keys),
        target_epoch=epoch,
        seen_newest=newest,
        counts=diff.counts,
        mode=mode.value,
    )
