"""Data files of a Delta table: writing Parquet, describing files others wrote, checking schemas."""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
import pyarrow.compute as pc  # type: ignore[import-untyped, unused-ignore]
import pyarrow.fs as pafs  # type: ignore[import-untyped, unused-ignore]
import pyarrow.parquet as pq  # type: ignore[import-untyped, unused-ignore]
from deltalake.transaction import AddAction

from reconcile.core.contract import InvalidInputError
from reconcile.core.durable import fsync_path

__all__ = [
    "DataFile",
    "check_file_schema",
    "data_file_rows",
    "delta_stats",
    "describe_data_file",
    "filesystem",
    "iter_data_batches",
    "read_data_files",
    "read_data_files_where",
    "write_data_file",
]


@dataclass(frozen=True, slots=True)
class DataFile:
    """One Parquet file already written under the table root, ready to be added.

    Attributes:
        path: the file's path relative to the table root, '/'-separated.
        size: its size in bytes.
        num_records: its row count.
        stats: Delta file statistics as JSON (numRecords, minValues, maxValues, nullCount).
        modification_time: milliseconds since the epoch.
        partition_values: partition column -> value as a string (empty: unpartitioned).
    """

    path: str
    size: int
    num_records: int
    stats: str
    modification_time: int
    partition_values: Mapping[str, str | None] = field(default_factory=dict)

    def to_add_action(self, *, data_change: bool = True) -> AddAction:
        """The Delta ``add`` action for this file (``data_change``: its dataChange flag)."""
        return AddAction(
            path=self.path,
            size=self.size,
            partition_values=dict(self.partition_values),
            modification_time=self.modification_time,
            data_change=data_change,
            stats=self.stats,
        )


def filesystem(table_uri: str) -> tuple[pafs.FileSystem, str]:
    """A pyarrow filesystem and the table root path inside it."""
    parsed = urlparse(table_uri)
    if parsed.scheme in ("", "file") or (len(parsed.scheme) == 1 and os.name == "nt"):
        root = parsed.path if parsed.scheme == "file" else table_uri
        return pafs.LocalFileSystem(), os.path.abspath(root)
    fs, root = pafs.FileSystem.from_uri(table_uri)
    return fs, root


def read_data_files(
    table_uri: str,
    rel_paths: Sequence[str],
    *,
    columns: Sequence[str] | None = None,
    schema: pa.Schema | None = None,
) -> pa.Table:
    """Read data files of a table (paths relative to its root) into one Arrow table.

    Args:
        table_uri: the Delta table's root.
        rel_paths: the files, relative to the root ('/'-separated); at least one.
        columns: the columns to read (default: all).
        schema: the schema to read them as (default: the first file's).

    Raises:
        FileNotFoundError: a file is gone (e.g. vacuumed).
    """
    fs, root = filesystem(table_uri)
    full = [f"{root}/{p}" for p in rel_paths]
    return pq.read_table(
        full if len(full) > 1 else full[0],
        filesystem=fs,
        columns=list(columns) if columns is not None else None,
        schema=schema,
    )


def iter_data_batches(table_uri: str, rel_path: str, *, columns: Sequence[str],
                      batch_rows: int = 1 << 16) -> Iterator[pa.RecordBatch]:  # fmt: skip
    """Read one data file in record batches of at most ``batch_rows`` (bounded memory).

    Raises:
        FileNotFoundError: the file is gone (e.g. vacuumed).
    """
    fs, root = filesystem(table_uri)
    with fs.open_input_file(f"{root}/{rel_path}") as handle:
        yield from pq.ParquetFile(handle).iter_batches(batch_size=batch_rows, columns=list(columns))


def read_data_files_where(
    table_uri: str,
    rel_paths: Sequence[str],
    *,
    columns: Sequence[str],
    keep: Callable[[pa.Table], pa.Array],
    empty: pa.Schema,
) -> pa.Table:
    """The rows of data files that ``keep`` marks, read a batch at a time.

    ``read_data_files`` holds every row before a filter could drop any; here
    each batch is filtered as it is read, so memory follows the rows kept (a
    few key ranges, a scope of keys), not the files. The batches take the first
    file's schema, as ``read_data_files`` gives them; ``empty`` is the schema
    when no file holds a row.

    Raises:
        FileNotFoundError: a file is gone (e.g. vacuumed).
    """
    kept: list[pa.Table] = []
    schema: pa.Schema | None = None
    for path in rel_paths:
        for batch in iter_data_batches(table_uri, path, columns=columns):
            table = pa.Table.from_batches([batch])
            schema = schema or table.schema
            kept.append(table.filter(keep(table)).cast(schema))
    return pa.concat_tables(kept) if kept else empty.empty_table()


def data_file_rows(table_uri: str, rel_paths: Sequence[str]) -> int:
    """The rows the data files hold, from their footers (no data is read)."""
    fs, root = filesystem(table_uri)
    total = 0
    for path in rel_paths:
        with fs.open_input_file(f"{root}/{path}") as handle:
            total += pq.ParquetFile(handle).metadata.num_rows
    return total


def _stat_value(value: Any) -> Any:
    """A JSON-safe statistics value, or None to leave the column's stat out."""
    if value is None or isinstance(value, bytes | bytearray):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, bool | int | float | str):
        return value
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return None


def delta_stats(data: pa.Table) -> str:
    """Delta statistics JSON for ``data``: numRecords, min, max and null counts per column.

    Columns whose min/max have no safe JSON form (binary, nested, NaN) only get a
    null count; Delta readers treat a missing min/max as "may contain anything".
    """
    mins: dict[str, Any] = {}
    maxs: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    for name, column in zip(data.column_names, data.columns, strict=True):
        nulls[name] = column.null_count
        kind = column.type
        if not (
            pa.types.is_integer(kind)
            or pa.types.is_floating(kind)
            or pa.types.is_string(kind)
            or pa.types.is_large_string(kind)
            or pa.types.is_date(kind)
            or pa.types.is_boolean(kind)
        ) or column.null_count == len(column):
            continue
        if pa.types.is_floating(kind) and pc.any(pc.is_nan(column)).as_py():
            continue
        bounds = pc.min_max(column).as_py()
        low, high = _stat_value(bounds["min"]), _stat_value(bounds["max"])
        if low is not None and high is not None:
            mins[name], maxs[name] = low, high
    return json.dumps(
        {"numRecords": data.num_rows, "minValues": mins, "maxValues": maxs, "nullCount": nulls},
        separators=(",", ":"),
    )


def write_data_file(
    table_uri: str, rel_path: str, data: pa.Table, *, fsync: bool = True
) -> DataFile:
    """Write ``data`` as one Parquet file at ``rel_path`` under the table root.

    The file is invisible to Delta readers until :func:`commit_files` adds it.
    It is fsynced (local files) so that a commit made after a crash of this
    process never references a torn file.

    Args:
        table_uri: the Delta table's root.
        rel_path: where to put the file, relative to the root ('/'-separated).
        data: the rows.
        fsync: flush the file (and its directory) to stable storage.

    Returns:
        The file's description, ready for :func:`commit_files`.
    """
    fs, root = filesystem(table_uri)
    full = f"{root}/{rel_path}"
    fs.create_dir(full.rsplit("/", 1)[0], recursive=True)
    pq.write_table(data, full, filesystem=fs, compression="snappy")
    if fsync and isinstance(fs, pafs.LocalFileSystem):
        fsync_path(full)
        fsync_path(os.path.dirname(full))
    size = fs.get_file_info(full).size
    return DataFile(
        path=rel_path,
        size=int(size or 0),
        num_records=data.num_rows,
        stats=delta_stats(data),
        modification_time=int(time.time() * 1000),
    )


def describe_data_file(table_uri: str, rel_path: str) -> DataFile:
    """Describe a Parquet file written by someone else (e.g. a Spark executor).

    Row count and size come from the file itself; min/max/null statistics come
    from its footer where the writer recorded them.

    Args:
        table_uri: the Delta table's root.
        rel_path: the file's path relative to the root.

    Returns:
        The file's description, ready for :func:`commit_files`.
    """
    fs, root = filesystem(table_uri)
    full = f"{root}/{rel_path}"
    info = fs.get_file_info(full)
    with fs.open_input_file(full) as handle:
        meta = pq.ParquetFile(handle).metadata
    mins: dict[str, Any] = {}
    maxs: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    arrow_schema = meta.schema.to_arrow_schema()
    for col in range(meta.num_columns):
        name = meta.schema.column(col).path
        if "." in name:
            continue  # nested: Delta stats need a nested shape; leave them out
        kind = arrow_schema.field(name).type
        count = 0
        low: Any = None
        high: Any = None
        usable = True
        for group in range(meta.num_row_groups):
            stats = meta.row_group(group).column(col).statistics
            if stats is None or not stats.has_null_count:
                usable = False
                break
            count += stats.null_count
            if not stats.has_min_max:
                continue
            lo, hi = _stat_value(stats.min), _stat_value(stats.max)
            if lo is None or hi is None:
                usable = False
                break
            low = lo if low is None or lo < low else low
            high = hi if high is None or hi > high else high
        if not usable:
            continue
        nulls[name] = count
        if low is not None and (
            pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_string(kind)
        ):
            mins[name], maxs[name] = low, high
    stats_json = json.dumps(
        {"numRecords": meta.num_rows, "minValues": mins, "maxValues": maxs, "nullCount": nulls},
        separators=(",", ":"),
    )
    mtime = info.mtime_ns // 1_000_000 if info.mtime_ns is not None else int(time.time() * 1000)
    return DataFile(
        path=rel_path,
        size=int(info.size or 0),
        num_records=meta.num_rows,
        stats=stats_json,
        modification_time=int(mtime),
    )


def check_file_schema(
    table_uri: str, files: Sequence[DataFile], schema: pa.Schema, *, table: str
) -> None:
    """Check every file's Parquet schema against ``schema`` (delta-rs does not).

    Raises:
        InvalidInputError: naming the table, the file, the column and both types;
            nothing was written to the Delta log.
    """
    fs, root = filesystem(table_uri)
    expected = {f.name: f.type for f in schema}
    for data_file in files:
        with fs.open_input_file(f"{root}/{data_file.path}") as handle:
            actual = pq.read_schema(handle)
        for name, kind in expected.items():
            index = actual.get_field_index(name)
            if index < 0:
                raise InvalidInputError(
                    f"table {table!r}: file {data_file.path!r} lacks column {name!r} "
                    f"(expected {kind}); nothing was written",
                    table=table,
                    column=name,
                    file=data_file.path,
                )
            got = actual.field(index).type
            if not got.equals(kind):
                raise InvalidInputError(
                    f"table {table!r}: column {name!r} in file {data_file.path!r} has type "
                    f"{got}, the table has {kind}; nothing was written",
                    table=table,
                    column=name,
                    file=data_file.path,
                    expected=str(kind),
                    actual=str(got),
                )
        extra = [n for n in actual.names if n not in expected]
        if extra:
            raise InvalidInputError(
                f"table {table!r}: file {data_file.path!r} has column {extra[0]!r}, which the "
                "table does not have; nothing was written",
                table=table,
                column=extra[0],
                file=data_file.path,
            )
