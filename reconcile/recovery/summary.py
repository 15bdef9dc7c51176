"""Bucket summaries: buckets mode's first-level expected figures, kept between searches.

Buckets mode compares, for ranges of the first key column, the rows and the sum
of row checksums that the database computes with the same figures for the
expected state. Computing the expected side means checksumming every expected
row, which costs more than the database's scan. A summary keeps the result:
the first level's bounds and (rows, checksum) per range, as of one store epoch.
The next search at a later epoch brings it forward from the store's changes in
between (the old and new rows of the keys changed: a cost that follows the
changes, not the table), so that only the database scans the whole table, and
the expected rows are read for the ranges that differ only. A range that grows
lopsided (ascending keys all land in the last one) is cut again from its own
rows (``rebalance``).

A summary is a cache, never the truth:

- it is keyed by the checksummed columns and their kinds, and by the Delta
  version that recorded its epoch (an epoch reverted and recorded again has
  another version: the summary is dropped);
- a search checks the expected rows it reads for every differing range against
  the summary's figures, and starts over from the expected rows when they
  disagree (``search_from_summary``);
- it lives next to the store table (``_reconcile_buckets/``) and may be deleted
  at any time: the next buckets search computes it again.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
import pyarrow.compute as pc  # type: ignore[import-untyped, unused-ignore]
import pyarrow.parquet as pq  # type: ignore[import-untyped, unused-ignore]

from expected_state.delta_files import filesystem
from expected_state.layout import OP_COLUMN
from expected_state.ranges import sortable_numbers
from reconcile.core.checksum import SEED, row_checksums
from reconcile.core.contract import InvalidInputError, StoreIntegrityError
from reconcile.core.expected import ExpectedStore
from reconcile.recovery.buckets import cut_bounds, first_position, range_figures, sort_expected

__all__ = [
    "BucketSummary",
    "bring_forward",
    "bucket_index",
    "load_summary",
    "rebalance",
    "save_summary",
]

log = logging.getLogger("reconcile.recovery")

_FORMAT = 1
_META = b"reconcile.bucket_summary"
FOLDER = "_reconcile_buckets"
# Past this share of the table changed since the summary, computing it again
# from the expected rows costs less than bringing it forward key by key (which
# reads the store for the old rows, and checksums the old and the new rows).
_MAX_CHANGED_SHARE = 0.05
# A range holding this many times its share of the rows has grown lopsided
# (e.g. ascending keys all land in the last range): compute the bounds again.
_MAX_SKEW = 8
_SKEW_SLACK = 1024


@dataclass(frozen=True)
class BucketSummary:
    """The first level of a bucket search, as of one store epoch.

    Attributes:
        epoch: the store epoch the figures are of.
        version: the Delta version that recorded ``epoch``.
        first_key: the first key column, which the bounds cut.
        columns: (column, checksum kind) of every checksummed column, in order.
        bounds: the range bounds (``len(rows) - 1`` values of the first key).
        rows: expected rows per range.
        sums: the sum of their row checksums per range, modulo 2**64.
    """

    epoch: int
    version: int
    first_key: str
    columns: tuple[tuple[str, str], ...]
    bounds: list[Any]
    rows: npt.NDArray[np.int64]
    sums: npt.NDArray[np.uint64]

    @property
    def figures(self) -> list[tuple[int, int]]:
        """(rows, checksum) per range, as the database side reports them."""
        return [(int(n), int(s)) for n, s in zip(self.rows, self.sums, strict=True)]


def _path(store: ExpectedStore, columns: Sequence[tuple[str, str]]) -> tuple[Any, str]:
    spec = json.dumps([list(c) for c in columns]).encode()
    digest = hashlib.sha256(spec).hexdigest()[:16]
    fs, root = filesystem(store.uri)
    return fs, f"{root}/{FOLDER}/summary-{digest}.parquet"


def save_summary(store: ExpectedStore, summary: BucketSummary) -> None:
    """Keep ``summary`` next to the store table (atomically; a failure is only logged)."""
    schema = store.user_schema
    if schema is None:
        return  # the store holds no epoch: a summary of it has nothing to describe
    fs, path = _path(store, summary.columns)
    key_type = schema.field(summary.first_key).type
    table = pa.table(
        {
            "lo": pa.array([None, *summary.bounds], key_type),
            "rows": pa.array(summary.rows, pa.int64()),
            "sums": pa.array(summary.sums, pa.uint64()),
        }
    )
    meta = {
        "format": _FORMAT,
        "epoch": summary.epoch,
        "version": summary.version,
        "first_key": summary.first_key,
        "columns": [list(c) for c in summary.columns],
        "seed": SEED,
    }
    table = table.replace_schema_metadata({_META: json.dumps(meta).encode()})
    tmp = f"{path}.{uuid.uuid4().hex}.tmp"
    try:
        fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
        pq.write_table(table, tmp, filesystem=fs)
        # A reader sees the old summary or the new one, never half of one.
        fs.move(tmp, path)
    except OSError as exc:
        # A summary only saves work: a store folder that refuses it costs the
        # next search its expected-side checksums, nothing else.
        log.warning("bucket summary of %s not kept: %s", store.uri, exc)


def load_summary(
    store: ExpectedStore, columns: Sequence[tuple[str, str]], first_key: str
) -> BucketSummary | None:
    """The kept summary for these columns, or None (absent, unreadable, other definition)."""
    fs, path = _path(store, columns)
    try:
        table = pq.read_table(path, filesystem=fs)
        meta = json.loads((table.schema.metadata or {})[_META])
    except (OSError, KeyError, ValueError) as exc:
        log.debug("no bucket summary of %s: %s", store.uri, exc)
        return None
    wanted = [list(c) for c in columns]
    if (
        meta.get("format") != _FORMAT
        or meta.get("seed") != SEED
        or meta.get("first_key") != first_key
        or meta.get("columns") != wanted
    ):
        return None
    return BucketSummary(
        epoch=int(meta["epoch"]),
        version=int(meta["version"]),
        first_key=first_key,
        columns=tuple((str(c), str(k)) for c, k in wanted),
        bounds=table.column("lo").to_pylist()[1:],
        rows=np.asarray(table.column("rows").to_numpy(), dtype=np.int64),
        sums=np.asarray(table.column("sums").to_numpy(), dtype=np.uint64),
    )


def bucket_index(column: pa.ChunkedArray | pa.Array, bounds: list[Any]) -> npt.NDArray[np.int64]:
    """The range of each value: how many bounds are at or below it (``width_bucket``)."""
    if not bounds:
        return np.zeros(len(column), dtype=np.int64)
    values = sortable_numbers(column) if column.null_count == 0 else None
    edges = sortable_numbers(pa.array(bounds, column.type))
    if values is not None and edges is not None:
        return np.searchsorted(edges, values, side="right").astype(np.int64)
    # Text, decimals, UUIDs: Python's order is the database's "C" order (code
    # points, i.e. UTF-8 bytes), as when the bounds were cut.
    return np.array([bisect.bisect_right(bounds, v) for v in column.to_pylist()], dtype=np.int64)


def _add(
    rows: npt.NDArray[np.int64],
    sums: npt.NDArray[np.uint64],
    table: pa.Table,
    summary: BucketSummary,
    sign: int,
) -> None:
    if table.num_rows == 0:
        return
    where = bucket_index(table.column(summary.first_key), summary.bounds)
    checksums = row_checksums(table, summary.columns)
    np.add.at(rows, where, sign)
    with np.errstate(over="ignore"):
        if sign > 0:
            np.add.at(sums, where, checksums)
        else:
            # Modulo 2**64: subtracting is adding the two's complement.
            np.add.at(sums, where, (~checksums) + np.uint64(1))


def _state_of(
    store: ExpectedStore, keys: pa.Table, since: int, epoch: int, names: list[str]
) -> pa.Table:
    """The rows at ``epoch`` of ``keys`` (all changed after ``since``), read from the change files.

    A key's newest change in ``(since, epoch]`` is its state at ``epoch``; only
    keys changed after ``epoch`` too are looked up in a snapshot.
    """
    newest = store.newest_changes(since, epoch, names)
    upserts = newest.filter(pc.equal(newest.column(OP_COLUMN), "upsert")).select(names)
    key_names = list(store.key_columns)
    rest = keys.join(newest.select(key_names), keys=key_names, join_type="left anti")
    if rest.num_rows == 0:
        return upserts
    return pa.concat_tables([upserts, store.snapshot(epoch, columns=names, keys=rest)])


def bring_forward(summary: BucketSummary, store: ExpectedStore, epoch: int) -> BucketSummary | None:
    """The summary as of ``epoch``, from the store's changes since its own epoch.

    Returns:
        The summary at ``epoch``, or None when it cannot be brought there (an
        older epoch, its own epoch recorded again, the changes since no longer
        all in the store, too many of them, or ranges grown lopsided): the
        caller computes it again from the expected rows.
    """
    try:
        if store.version_of(summary.epoch) != summary.version or epoch < summary.epoch:
            return None
        version = store.version_of(epoch)
        if epoch == summary.epoch:
            return summary
        changed = store.changed_keys(summary.epoch).select(store.key_columns)
        total = int(summary.rows.sum())
        if changed.num_rows > max(1024, total * _MAX_CHANGED_SHARE):
            return None
        names = [c for c, _ in summary.columns]
        before = store.snapshot(summary.epoch, columns=names, keys=changed)
        after = _state_of(store, changed, summary.epoch, epoch, names)
    except StoreIntegrityError:
        raise  # the store itself is not to be trusted: never recompute from it
    except InvalidInputError as exc:
        log.info("bucket summary of %s computed again: %s", store.uri, exc)
        return None
    rows = summary.rows.copy()
    sums = summary.sums.copy()
    # A key changed since: its old row leaves its range, its new row (if any) joins one.
    _add(rows, sums, before, summary, -1)
    _add(rows, sums, after, summary, +1)
    if (rows < 0).any():
        return None  # not the state it claims to be of: never trust it
    return replace(summary, epoch=epoch, version=version, rows=rows, sums=sums)


def rebalance(
    summary: BucketSummary, read: Callable[[list[tuple[Any, Any]]], pa.Table]
) -> BucketSummary | None:
    """Cut again the ranges that have grown lopsided (ascending keys all land in the last one).

    A differing range costs the search its expected rows' checksums, so a range
    holding many times its share would cost a search what the summary saves.
    Only those ranges' expected rows are read (``read``: the rows of some
    ``[lo, hi)`` ranges at the summary's epoch), so the cost follows the rows
    added since the ranges were cut.

    Returns:
        The summary with those ranges cut into ranges of about the average
        size, or None when their rows do not add up to the summary's figures.
    """
    share = max(1, int(summary.rows.sum()) // len(summary.rows))
    lopsided = [b for b, n in enumerate(summary.rows) if n > _MAX_SKEW * share + _SKEW_SLACK]
    if not lopsided:
        return summary
    lows = [None, *summary.bounds]
    highs = [*summary.bounds, None]
    table = sort_expected(read([(lows[b], highs[b]) for b in lopsided]), summary.first_key)
    column = table.column(summary.first_key).combine_chunks()
    checksums = row_checksums(table, summary.columns)
    bounds: list[Any] = []
    figures: list[tuple[int, int]] = []
    for b, kept in enumerate(summary.figures):
        if b:
            bounds.append(summary.bounds[b - 1])
        if b not in lopsided:
            figures.append(kept)
            continue
        lo, hi = lows[b], highs[b]
        start = 0 if lo is None else first_position(column, lo, 0, len(column))
        stop = len(column) if hi is None else first_position(column, hi, start, len(column))
        if range_figures(checksums, start, stop, [])[0] != kept:
            return None  # the summary is not the store's state: never trust it
        inner, positions = cut_bounds(column, start, stop, -(-(stop - start) // share))
        bounds.extend(inner)
        figures.extend(range_figures(checksums, start, stop, positions))
    return replace(
        summary,
        bounds=bounds,
        rows=np.array([n for n, _ in figures], dtype=np.int64),
        sums=np.array([c for _, c in figures], dtype=np.uint64),
    )
