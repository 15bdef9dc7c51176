"""Reading store files written before a column was added: the new columns NULL, hashes redone.

A store table whose schema evolved (``ExpectedStateStore.evolve``) keeps the
files its earlier epochs wrote as they are: nothing of the table is rewritten
when a column is added, so the epoch that adds it costs what its own rows cost.
Those files lack the new column, and their ``_row_hash`` was computed over the
columns of their day: the row hash covers every column and its NULL mask
(``docs/hashing.md``), so a row's hash changes when a column is added, even
as NULL. Every reader of the store goes through here, and gets such rows as
the table holds them now: the new columns NULL, ``_row_hash`` recomputed over
the current columns (tombstones keep theirs, NULL). A diff against the sink,
whose old rows read NULL in the new column too, then finds them equal.

The check costs one Parquet footer per file, once per process, and only in a
table that has an added column (its field metadata ``reconcile.added_epoch``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
import pyarrow.compute as pc  # type: ignore[import-untyped, unused-ignore]
import pyarrow.parquet as pq  # type: ignore[import-untyped, unused-ignore]

from expected_state.delta_files import (
    filesystem,
    iter_data_batches,
    read_data_files,
    read_data_files_where,
)
from expected_state.layout import OP_COLUMN, RESERVED_COLUMNS, ROW_HASH_COLUMN
from reconcile.core.hashing import row_hash_arrow
from reconcile.core.schema_change import ADDED_EPOCH

__all__ = [
    "ADDED_EPOCH",
    "has_added_columns",
    "iter_store_batches",
    "read_store_files",
    "read_store_files_where",
]


def has_added_columns(stored: pa.Schema) -> bool:
    """Whether a column of ``stored`` was added after the table was created."""
    return any(ADDED_EPOCH in (f.metadata or {}) for f in stored)


@functools.lru_cache(maxsize=1 << 16)
def _file_columns(uri: str, path: str) -> frozenset[str]:
    """The columns a data file holds (its footer); files never change once written."""
    fs, root = filesystem(uri)
    with fs.open_input_file(f"{root}/{path}") as handle:
        return frozenset(pq.read_schema(handle).names)


def _lacks(uri: str, path: str, stored: pa.Schema) -> bool:
    return not set(stored.names) <= _file_columns(uri, path)


def _plain(schema: pa.Schema, columns: Sequence[str]) -> pa.Schema:
    return pa.schema([schema.field(c).remove_metadata() for c in columns])


def _conform(rows: pa.Table, stored: pa.Schema) -> pa.Table:
    """An older file's rows in the ``stored`` schema: new columns NULL, upserts rehashed."""
    columns = [
        rows.column(f.name).cast(f.type)
        if f.name in rows.column_names
        else pa.nulls(rows.num_rows, f.type)
        for f in stored
    ]
    table = pa.table(columns, schema=_plain(stored, stored.names))
    user = [n for n in stored.names if n not in RESERVED_COLUMNS]
    hashes = row_hash_arrow(table, user)
    upsert = pc.equal(table.column(OP_COLUMN), "upsert")
    redone = pc.if_else(upsert, hashes, pa.scalar(None, pa.int64()))
    return table.set_column(
        stored.get_field_index(ROW_HASH_COLUMN), stored.field(ROW_HASH_COLUMN), redone
    )


def _read_old(uri: str, path: str, stored: pa.Schema) -> pa.Table:
    held = [n for n in stored.names if n in _file_columns(uri, path)]
    return _conform(read_data_files(uri, [path], columns=held), stored)


def read_store_files(
    uri: str, paths: Sequence[str], *, columns: Sequence[str], stored: pa.Schema
) -> pa.Table:
    """``read_data_files`` of a store table, files of an older schema conformed to ``stored``.

    Raises:
        FileNotFoundError: a file is gone (e.g. vacuumed).
    """
    if not has_added_columns(stored):
        return read_data_files(uri, paths, columns=columns)
    target = _plain(stored, columns)
    parts = []
    for path in paths:
        if _lacks(uri, path, stored):
            parts.append(_read_old(uri, path, stored).select(list(columns)))
        else:
            parts.append(read_data_files(uri, [path], columns=columns).cast(target))
    return pa.concat_tables(parts) if parts else target.empty_table()


def read_store_files_where(
    uri: str,
    paths: Sequence[str],
    *,
    columns: Sequence[str],
    keep: Callable[[pa.Table], pa.Array],
    empty: pa.Schema,
    stored: pa.Schema,
) -> pa.Table:
    """``read_data_files_where`` of a store table, files of an older schema conformed."""
    if not has_added_columns(stored):
        return read_data_files_where(uri, paths, columns=columns, keep=keep, empty=empty)
    target = _plain(stored, columns)
    kept = []
    for path in paths:
        if _lacks(uri, path, stored):
            rows = _read_old(uri, path, stored).select(list(columns))
            kept.append(rows.filter(keep(rows)))
        else:
            rows = read_data_files_where(uri, [path], columns=columns, keep=keep, empty=empty)
            kept.append(rows.cast(target))
    return pa.concat_tables(kept) if kept else target.empty_table()


def iter_store_batches(
    uri: str, path: str, *, columns: Sequence[str], stored: pa.Schema
) -> Iterator[pa.RecordBatch]:
    """``iter_data_batches`` of a store table; a file of an older schema is read whole.

    An older file is one epoch's changes, or a base part of bounded size, so
    reading it whole keeps memory bounded by a file, as its writer did.
    """
    if has_added_columns(stored) and _lacks(uri, path, stored):
        yield from _read_old(uri, path, stored).select(list(columns)).to_batches()
        return
    yield from iter_data_batches(uri, path, columns=columns)
