"""Finding what differs, by mode: pull the sink's rows, hash them, diff them by key and hash.

The recovery engine (``engine.py``) opens the snapshot and picks the mode;
these functions do the mode's work on that snapshot:

- full: every row of the sink against every expected row;
- scoped: the keys the store changed since an epoch, plus the sink's rows of
  later epochs (by ``_epoch``);
- buckets: the key ranges whose checksums differ (``buckets.py``), then only
  their rows.

Each pull and each diff is a step named for an interruption
(``reconcile.core.interrupts``): SIGINT or SIGTERM there says "the pull of
public.orders", and a signal whose exception a library swallowed on its way
up is raised again when the next step begins.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]

from reconcile.core.contract import InvalidInputError, StoreIntegrityError
from reconcile.core.expected import ExpectedStore
from reconcile.core.spill import parts_for
from reconcile.core.target import KeyRange, Progress, SinkSnapshot
from reconcile.recovery.bucket_parts import part_figures, sorted_first_keys
from reconcile.recovery.buckets import (
    BucketLimits,
    BucketSearch,
    cut_bounds,
    find_differing_ranges,
    search_from_summary,
    search_sorted,
    sort_expected,
)
from reconcile.recovery.diff import HASH, Diff, diff_tables
from reconcile.recovery.in_parts import diff_in_parts, hashed_rows
from reconcile.recovery.options import DEFAULT_CHUNK_ROWS, MemoryKeywords
from reconcile.recovery.source import ExpectedSource
from reconcile.recovery.steps import DIFFING, PULLING, check_step
from reconcile.recovery.summary import (
    BucketSummary,
    bring_forward,
    load_summary,
    rebalance,
    save_summary,
)

__all__ = [
    "DIFFING",
    "PULLING",
    "Found",
    "check_step",
    "find_buckets",
    "find_full",
    "find_scoped",
]

log = logging.getLogger("reconcile.recovery")

# A first bucket search's checksum pass holds parts of chunk_rows rows of this
# many columns (fewer rows when the table has more columns).
_PART_COLUMNS = 4


@dataclass
class Found:
    """What a mode found: the diff, the expected rows it compared, what it pulled."""

    diff: Diff
    expected: pa.Table  # the expected rows compared (keys + hash, maybe values)
    pulled: int
    compared: int = 0
    differing: int = 0
    # Buckets mode stopped after its first level: why full mode costs less.
    dearer: str | None = None
    # Scoped mode: the rows it looked at ("": every row, or every differing range).
    scope: str = ""


def find_full(snap: SinkSnapshot, source: ExpectedSource, schema: pa.Schema, keys: list[str],
              epoch: int, progress: Progress | None, memory: MemoryKeywords) -> Found:  # fmt: skip
    """Full mode: every row of the sink against every expected row.

    A table of at most ``chunk_rows`` rows (by the store's files and the
    database's estimate) is diffed in memory; a larger one in parts by key
    hash, spilled under ``spill_dir`` (``in_parts.py``), so that memory is set
    by ``chunk_rows``, not by the table.
    """
    chunk_rows = memory.get("chunk_rows", DEFAULT_CHUNK_ROWS)
    spill_dir = memory.get("spill_dir")
    estimate = snap.estimated_rows() or 0
    parts = parts_for(max(source.store.stored_rows(epoch), estimate), chunk_rows)
    if parts > 1:
        log.info("full mode: %d parts of about %d rows, spilled under %s", parts, chunk_rows,
                 spill_dir or "the temporary folder")  # fmt: skip
        diff, rows, pulled = diff_in_parts(
            snap, source, schema, keys, epoch, progress, parts=parts, where=spill_dir,
        )  # fmt: skip
        return Found(diff, rows, pulled)
    expected = source.hashes(epoch, keys)
    with check_step("the pull", PULLING):
        raw = snap.pull_all(progress)
    with check_step("the diff", DIFFING):
        diff = diff_tables(expected, hashed_rows(raw, schema, keys), keys)
    return Found(diff, expected, raw.num_rows)


def find_scoped(snap: SinkSnapshot, source: ExpectedSource, schema: pa.Schema,
                keys: list[str], epoch: int, since: int) -> Found:  # fmt: skip
    """Scoped mode: the keys the store changed after ``since``, and the later epochs' rows."""
    try:
        changed = source.store.changed_keys(since).select(keys)
    except StoreIntegrityError:
        raise  # the store lost rows (or holds foreign ones): said as such, not "use full"
    except InvalidInputError as err:
        raise InvalidInputError(
            f"scoped mode: the expected state cannot list the keys changed since the sink's "
            f"newest marker (epoch {since}): {err}; use mode full or buckets"
        ) from err
    with check_step("the pull", PULLING):
        raw = snap.pull_keys(changed, since)
    with check_step("the diff", DIFFING):
        actual = hashed_rows(raw, schema, keys)
        scope = pa.concat_tables([changed.cast(actual.select(keys).schema), actual.select(keys)])
        expected = source.of_keys(epoch, keys, scope, since)
        compared = expected.select([*keys, HASH])
        diff = diff_tables(compared, actual, keys)
    scope = (
        f"the {changed.num_rows} keys the store changed after epoch {since}, and the sink's "
        f"rows of epochs after {since}"
    )
    return Found(diff, expected, raw.num_rows, scope=scope)


def find_buckets(
    snap: SinkSnapshot,
    source: ExpectedSource,
    schema: pa.Schema,
    keys: list[str],
    epoch: int,
    sink_types: dict[str, str],
    limits: BucketLimits,
    memory: MemoryKeywords,
) -> Found:
    """Buckets mode: the ranges whose checksums differ, then only their rows.

    From a kept summary when there is one; else from the expected rows, read
    whole when the store holds at most ``chunk_rows`` rows, or in parts
    (``bucket_parts.py``) holding only the first key column, then the ranges'
    figures.
    """
    snap.check_buckets()
    columns = [(name, sink_types[name]) for name in schema.names]
    store = source.store
    names = [*schema.names, HASH]
    searched = None

    def read(spans: list[tuple[Any, Any]]) -> pa.Table:
        if not spans:  # nothing differs: no need to read the store at all
            fields = [schema.field(c) for c in schema.names]
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
        chunk_rows = memory.get("chunk_rows", DEFAULT_CHUNK_ROWS)
        parts = parts_for(store.stored_rows(epoch), chunk_rows)
        if parts > 1:
            # Too many rows to hold whole: the first level's figures are computed
            # part by part, and the search goes on as from a kept summary.
            search, expected = _first_in_parts(
                snap, store, epoch, columns, keys[0], limits, read, memory,
            )  # fmt: skip
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
        nothing = pa.schema([schema.field(k) for k in keys]).empty_table()
        return Found(Diff(nothing, nothing, nothing), nothing, 0, search.compared,
                      search.differing, search.dearer)  # fmt: skip
    raw = None
    if search.leaves:
        # The leaves are pulled in one query: the round trips do not grow with the drift.
        with check_step("the pull", PULLING):
            raw = snap.pull_ranges([within for within, _, _ in search.leaves])
    slices = [expected.slice(start, stop - start) for _, start, stop in search.leaves]
    rows = pa.concat_tables(slices) if slices else expected.slice(0, 0)
    compared = rows.select([*keys, HASH])
    pulled = raw.num_rows if raw is not None else 0
    with check_step("the diff", DIFFING if pulled else None):
        actual = hashed_rows(raw, schema, keys) if pulled else compared.slice(0, 0)
        diff = diff_tables(compared, actual, keys)
    # With their values: a repair writes from them, never reading the whole table again.
    found = Found(diff, rows, pulled)
    found.compared, found.differing = search.compared, search.differing
    return found


def _first_in_parts(
    snap: SinkSnapshot,
    store: ExpectedStore,
    epoch: int,
    columns: list[tuple[str, str]],
    first_key: str,
    limits: BucketLimits,
    read: Callable[[list[tuple[Any, Any]]], pa.Table],
    memory: MemoryKeywords,
) -> tuple[BucketSearch, pa.Table]:
    """A first search without a summary, the expected side read in parts (``bucket_parts.py``).

    ``memory``: ``chunk_rows`` (the rows of a part, ``DEFAULT_CHUNK_ROWS`` unless
    given) and ``spill_dir`` (where the parts spill: None, the system's temporary folder).

    Returns the search (its ``top`` the figures to keep) and the expected rows
    its leaves' positions are of (the rows of the first level's differing
    ranges, sorted).
    """
    chunk_rows, where = memory.get("chunk_rows", DEFAULT_CHUNK_ROWS), memory.get("spill_dir")
    stored = store.stored_rows(epoch)
    column = sorted_first_keys(store, epoch, first_key, parts=parts_for(stored, chunk_rows),
                               where=where)  # fmt: skip
    if len(column) == 0:
        # No expected row at all (every key deleted): one range, and nothing to read.
        return search_sorted(snap, column, lambda: np.zeros(0, np.uint64), limits), read([])
    bounds, _ = cut_bounds(column, 0, len(column), limits.first_level)
    del column  # the bounds are all the rest needs of it
    # The checksum pass reads every column, where full mode's parts hold the
    # keys and the hash: a part of chunk_rows rows of every column would hold
    # more (TPC-H lineitem, 16 columns: 860 MB peak in parts of 860,000 rows;
    # 380 MB in parts of 215,000). Its parts are cut to chunk_rows rows of
    # _PART_COLUMNS columns.
    wide_rows = max(1, min(chunk_rows, chunk_rows * _PART_COLUMNS // len(columns)))
    parts = parts_for(stored, wide_rows)
    stop = threading.Event()
    with ThreadPoolExecutor(max_workers=1) as pool:
        # The database scans the whole table while the expected rows are read
        # and checksummed in a worker: the two overlap. The query waits in this
        # (the caller's) thread, where a signal can interrupt it and cancel it
        # on the server; if it fails, the worker stops at its next part.
        ours = pool.submit(part_figures, store, epoch, columns, first_key, bounds,
                           parts=parts, where=where, stop=stop)  # fmt: skip
        try:
            theirs = snap.bucket_sums(bounds, [KeyRange()])
        except BaseException:
            stop.set()
            raise
        rows, sums = ours.result()
    figures = [(int(n), int(s)) for n, s in zip(rows, sums, strict=True)]
    searched = search_from_summary(
        snap, bounds, figures, lambda ranges: read([(r.lo, r.hi) for r in ranges]),
        columns, first_key, limits, theirs,
    )  # fmt: skip
    if searched is None:
        # The rows read by range do not add up to the figures the same epoch's
        # parts gave: the store reads one snapshot two ways, and they disagree.
        raise StoreIntegrityError(
            f"table {store.uri!r}: the expected rows of epoch {epoch} read by key range do not "
            "add up to the same rows read in parts; the store cannot be trusted",
            table=store.uri,
            epoch=epoch,
        )
    search, expected = searched
    search.top = (bounds, figures)
    return search, expected
