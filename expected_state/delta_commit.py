"""Commit already-written Parquet files to a Delta table in one idempotent Delta commit."""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
import pyarrow.compute as pc  # type: ignore[import-untyped, unused-ignore]
import pyarrow.fs as pafs  # type: ignore[import-untyped, unused-ignore]
import pyarrow.parquet as pq  # type: ignore[import-untyped, unused-ignore]
from deltalake import CommitProperties, DeltaTable, Transaction
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError
from deltalake.transaction import AddAction, RemoveAction

from reconcile.contract import InvalidInputError, OutcomeUnknownError, RetryableError
from reconcile.durable import fsync_path

__all__ = [
    "DEFAULT_COMMIT_RETRIES",
    "CommitResult",
    "DataFile",
    "check_file_schema",
    "commit_files",
    "delta_stats",
    "describe_data_file",
    "recorded_version",
    "table_exists",
    "write_data_file",
]

# delta-rs rebases a commit that lost the race for a log version and retries
# it after its own conflict check (which also rejects a concurrent commit of
# the same app transaction). Unbounded retries would hide a hot table, so the
# number is fixed; past it the caller gets a RetryableError (nothing written).
DEFAULT_COMMIT_RETRIES = 8


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

    def to_add_action(self) -> AddAction:
        """The Delta ``add`` action for this file."""
        return AddAction(
            path=self.path,
            size=self.size,
            partition_values=dict(self.partition_values),
            modification_time=self.modification_time,
            data_change=True,
            stats=self.stats,
        )


@dataclass(frozen=True, slots=True)
class CommitResult:
    """What :func:`commit_files` did.

    Attributes:
        committed: True if this call made the commit; False if the token was already recorded.
        table_version: the Delta version that holds the token (None if unknown, e.g. a no-op
            whose commit has been cleaned from the log).
    """

    committed: bool
    table_version: int | None


def _filesystem(table_uri: str) -> tuple[pafs.FileSystem, str]:
    """A pyarrow filesystem and the table root path inside it."""
    parsed = urlparse(table_uri)
    if parsed.scheme in ("", "file") or (len(parsed.scheme) == 1 and os.name == "nt"):
        root = parsed.path if parsed.scheme == "file" else table_uri
        return pafs.LocalFileSystem(), os.path.abspath(root)
    fs, root = pafs.FileSystem.from_uri(table_uri)
    return fs, root


def table_exists(table_uri: str) -> bool:
    """True if a Delta table exists at ``table_uri``."""
    return DeltaTable.is_deltatable(table_uri)


def recorded_version(table_uri: str, app_id: str) -> int | None:
    """The newest version recorded for ``app_id`` in the table's log (None if none or no table)."""
    try:
        return DeltaTable(table_uri).transaction_version(app_id)
    except TableNotFoundError:
        return None


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
    fs, root = _filesystem(table_uri)
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
    fs, root = _filesystem(table_uri)
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
    fs, root = _filesystem(table_uri)
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


def _open_or_create(table_uri: str, schema: pa.Schema, partition_by: Sequence[str]) -> DeltaTable:
    """Open the table, creating it empty (version 0) if it does not exist yet.

    ``mode="ignore"`` makes creation idempotent and safe against a concurrent
    creator: whoever loses the race simply opens the winner's table.
    """
    try:
        return DeltaTable(table_uri)
    except TableNotFoundError:
        DeltaTable.create(table_uri, schema, mode="ignore", partition_by=list(partition_by) or None)
        return DeltaTable(table_uri)


def commit_files(
    table_uri: str,
    files: Sequence[DataFile],
    schema: pa.Schema,
    *,
    app_id: str,
    version: int,
    remove: Sequence[DataFile] = (),
    extra_transactions: Sequence[tuple[str, int]] = (),
    partition_by: Sequence[str] = (),
    custom_metadata: Mapping[str, Any] | None = None,
    check_schema: bool = True,
    max_retries: int = DEFAULT_COMMIT_RETRIES,
    table_name: str | None = None,
    table: DeltaTable | None = None,
    token_checked: bool = False,
) -> CommitResult:
    """Add ``files`` (and remove ``remove``) in ONE Delta commit tagged (app_id, version).

    The token is checked first, because delta-rs does not reject a replayed app
    transaction: if the table already records ``version`` (or a newer one) for
    ``app_id``, nothing is done and ``committed`` is False. The table is created
    (empty, version 0) if it does not exist.

    Args:
        table_uri: the Delta table's root (path or URI).
        files: Parquet files already written under the root.
        schema: the table's Arrow schema (used to create it and to check files).
        app_id: idempotency token's application id.
        version: idempotency token's version (an epoch), >= 0.
        remove: files of the current snapshot to remove in the same commit.
        extra_transactions: more (app_id, version) tokens to record in the same commit,
            e.g. the writer's fencing generation. Two concurrent commits that carry
            the same app id conflict in delta-rs, so a shared token serialises writers.
        partition_by: partition columns, for a table created here.
        custom_metadata: extra commitInfo fields (JSON-serialisable).
        check_schema: read each file's footer and compare it to ``schema``.
        max_retries: bound on delta-rs' conflict retries.
        table_name: how errors name the table (default: the URI).
        table: an open DeltaTable of ``table_uri`` to reuse, saving a log replay on hot
            paths. The caller keeps it current; a stale one is still safe, because
            delta-rs' conflict check rebases or rejects the commit. It is brought up
            to date after the commit.
        token_checked: the caller has just read ``transaction_version(app_id)`` from
            ``table`` and found it below ``version``; skips re-reading it. A
            concurrent replay is still caught by delta-rs' conflict check.

    Returns:
        Whether this call committed, and the table version holding the token.

    Raises:
        InvalidInputError: a file's schema does not match; nothing was written.
        RetryableError: the commit lost to concurrent writers more than
            ``max_retries`` times; nothing was written.
        OutcomeUnknownError: the commit failed in a way that may have left it
            recorded, and re-reading the log to find out failed too.
    """
    name = table_name or table_uri
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise InvalidInputError(
            f"table {name!r}: commit token version must be an int >= 0, got {version!r}; "
            "nothing was written",
            table=name,
            value=repr(version),
        )
    if check_schema and files:
        check_file_schema(table_uri, files, schema, table=name)
    if table is None:
        table = _open_or_create(table_uri, schema, partition_by)
    already = None if token_checked else table.transaction_version(app_id)
    if already is not None and already >= version:
        # Replay of a recorded (or superseded) token: the files of this attempt
        # are orphans that vacuum removes; committing them would duplicate rows.
        return CommitResult(committed=False, table_version=None)
    now = int(time.time() * 1000)
    actions: list[AddAction | RemoveAction] = [f.to_add_action() for f in files]
    actions += [
        RemoveAction(
            path=f.path,
            data_change=True,
            deletion_timestamp=now,
            size=f.size,
            partition_values=dict(f.partition_values),
        )
        for f in remove
    ]
    metadata = {"reconcile.app_id": app_id, "reconcile.version": version}
    metadata.update(custom_metadata or {})
    properties = CommitProperties(
        custom_metadata=metadata,
        max_commit_retries=max_retries,
        app_transactions=[Transaction(app_id=app_id, version=version)]
        + [Transaction(app_id=token_id, version=token) for token_id, token in extra_transactions],
    )
    try:
        table.create_write_transaction(
            actions,
            mode="append",
            schema=schema,
            partition_by=list(partition_by) or None,
            commit_properties=properties,
        )
    except (CommitFailedError, DeltaError, OSError) as exc:
        return _resolve_failed_commit(table_uri, name, app_id, version, exc)
    table.update_incremental()
    return CommitResult(committed=True, table_version=table.version())


def _resolve_failed_commit(
    table_uri: str, name: str, app_id: str, version: int, exc: Exception
) -> CommitResult:
    """Decide what a failed commit means by re-reading the log, never by guessing.

    Cases:
      * the token is now recorded: a concurrent writer (or our own attempt,
        if the failure came after the log write) committed it, so the epoch is
        in and this is the idempotent no-op;
      * the token is not recorded and the failure is a lost race: nothing
        was written, the caller may retry (RetryableError);
      * any other failure with the token absent: a Delta log entry is written by
        one atomic put-if-absent, so absent means not written (RetryableError);
      * the log cannot be re-read: we cannot tell (OutcomeUnknownError).
    """
    try:
        now = DeltaTable(table_uri).transaction_version(app_id)
    except Exception as reread:  # any failure to re-read means "unknown"
        raise OutcomeUnknownError(
            f"table {name!r}: commit of token ({app_id!r}, {version}) failed ({exc}) and the "
            f"log could not be re-read ({reread}); whether it was written is unknown",
            table=name,
            app_id=app_id,
            version=version,
        ) from exc
    if now is not None and now >= version:
        return CommitResult(committed=False, table_version=None)
    reason = "lost to concurrent writers" if isinstance(exc, CommitFailedError) else "failed"
    raise RetryableError(
        f"table {name!r}: commit of token ({app_id!r}, {version}) {reason}: {exc}; "
        "nothing was written",
        table=name,
        app_id=app_id,
        version=version,
    ) from exc
