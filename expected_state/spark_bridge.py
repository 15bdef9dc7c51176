"""Spark bridge of the expected-state store: read and write its Delta tables without Delta JARs.

Reading: the table's active file list at a version comes from delta-rs; Spark reads
those Parquet files directly, with the schema from the Delta log.

Writing: executors write Parquet files into a fresh, visible subfolder of the table
(``spark-<app>-<version>-<uuid>/``); only the file list reaches the driver, which
checks every file's schema against the table's (delta-rs does not) and adds all of
them in ONE Delta commit carrying the token ``Transaction(app_id, version)``
(``expected_state.delta_commit.commit_files``). Until that commit the files are
invisible to every Delta reader; if the writer dies first they are orphans that
``DeltaTable.vacuum(full=True)`` deletes once older than the retention period.

Where delta-spark's JARs are on the classpath (a user's cluster, never here), the
native ``format("delta")`` reader and writer are used instead (``native=None``
detects them); that branch is deliberately thin.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import unquote, urlparse

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
import pyarrow.fs as pafs  # type: ignore[import-untyped, unused-ignore]
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from expected_state.delta_commit import (
    DataFile,
    DeltaCommit,
    check_file_schema,
    commit_files,
    describe_data_file,
)
from expected_state.delta_log import transaction_version
from reconcile.core.contract import ConfigurationError, InvalidInputError, OutcomeUnknownError

__all__ = ["BridgeWriteResult", "delta_jars_available", "read_delta", "write_delta"]

# Reader features that change what a Parquet file means: a plain file-list read
# would be wrong, so such tables are refused rather than misread.
_UNSUPPORTED_READER_FEATURES = {"deletionVectors", "columnMapping"}
_HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"
_STAGING_PREFIX = "spark-"


@dataclass(frozen=True, slots=True)
class BridgeWriteResult:
    """What :func:`write_delta` did.

    Attributes:
        committed: True if this call made the commit; False if the token was already there.
        table_version: the Delta version of the commit (None for a no-op).
        files: how many data files the commit added (-1: unknown, on the native path).
        rows: how many rows the commit added (-1: unknown, on the native path).
    """

    committed: bool
    table_version: int | None
    files: int
    rows: int


def delta_jars_available(spark: Any) -> bool:
    """True if delta-spark's JVM classes are on the session's classpath."""
    jvm = spark.sparkContext._jvm
    try:
        # Through the thread's class loader: the JARs a session takes from
        # ``spark.jars`` are loaded by Spark's own loader, which Class.forName
        # from the py4j gateway (the system loader) does not see.
        jvm.java.lang.Thread.currentThread().getContextClassLoader().loadClass(
            "io.delta.tables.DeltaTable"
        )
    except Exception:
        return False
    return True


def _open(table_uri: str, version: int | None = None) -> DeltaTable:
    try:
        return DeltaTable(table_uri, version=version)
    except TableNotFoundError as exc:
        raise InvalidInputError(
            f"no Delta table at {table_uri!r}"
            + (f" (version {version})" if version is not None else ""),
            table=table_uri,
        ) from exc


def _arrow_schema(table: DeltaTable) -> pa.Schema:
    return pa.schema(table.schema().to_arrow())


def _spark_schema(schema: pa.Schema) -> Any:
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(schema, prefer_timestamp_ntz=True)


def _file_path(root: str, rel: str) -> str:
    """The full path of an add action's file (relative paths are URI-encoded)."""
    if "://" in rel or rel.startswith("/"):
        return rel
    return f"{root.rstrip('/')}/{unquote(rel)}"


def read_delta(
    spark: Any, table_uri: str, version: int | None = None, *, native: bool | None = None
) -> Any:
    """Read a Delta table into a Spark DataFrame, as of a version, without Delta JARs.

    Args:
        spark: the SparkSession.
        table_uri: the table's root (a local path or a URI Spark and delta-rs both read).
        version: the Delta version to read (time travel); default: the latest.
        native: use delta-spark's reader; default: only if its JARs are present.

    Returns:
        A DataFrame with the table's columns in the table's order. Nothing of the
        table's size passes through the driver.

    Raises:
        InvalidInputError: there is no table (or no such version) at ``table_uri``.
        ConfigurationError: the table uses deletion vectors or column mapping,
            which a plain Parquet read would get wrong.
    """
    if native or (native is None and delta_jars_available(spark)):
        reader = spark.read.format("delta")
        return (reader.option("versionAsOf", version) if version is not None else reader).load(
            table_uri
        )
    from pyspark.sql import functions as F

    table = _open(table_uri, version)
    features = set(table.protocol().reader_features or ()) & _UNSUPPORTED_READER_FEATURES
    if features:
        raise ConfigurationError(
            f"Delta table {table_uri!r} uses reader features {sorted(features)}; the Spark "
            "bridge reads plain Parquet and cannot apply them: add delta-spark's JARs",
            table=table_uri,
        )
    schema = _spark_schema(_arrow_schema(table))
    partitions = list(table.metadata().partition_columns)
    adds = pa.table(table.get_add_actions(flatten=True))
    if adds.num_rows == 0:
        return spark.createDataFrame([], schema)
    paths = [_file_path(table.table_uri, p) for p in adds.column("path").to_pylist()]
    data_schema = type(schema)([f for f in schema.fields if f.name not in partitions])
    if not partitions:
        return spark.read.schema(data_schema).parquet(*paths)
    # Partition values live in the log, not in the files: read each partition's
    # files and add its values as literals.
    groups: dict[tuple[Any, ...], list[str]] = {}
    keys = zip(*(adds.column(f"partition.{c}").to_pylist() for c in partitions), strict=True)
    for path, key in zip(paths, keys, strict=True):
        groups.setdefault(tuple(key), []).append(path)
    types = {f.name: f.dataType for f in schema.fields}
    frames = []
    for key, files in groups.items():
        frame = spark.read.schema(data_schema).parquet(*files)
        for column, value in zip(partitions, key, strict=True):
            frame = frame.withColumn(column, F.lit(value).cast(types[column]))
        frames.append(frame.select(*schema.fieldNames()))
    result = frames[0]
    for frame in frames[1:]:
        result = result.unionByName(frame)
    return result


def _filesystem(table_uri: str) -> tuple[pafs.FileSystem, str]:
    parsed = urlparse(table_uri)
    if parsed.scheme in ("", "file"):
        return pafs.LocalFileSystem(), os.path.abspath(parsed.path if parsed.scheme else table_uri)
    fs, root = pafs.FileSystem.from_uri(table_uri)
    return fs, root


@contextmanager
def _parquet_timestamps_as_micros(spark: Any) -> Iterator[None]:
    """Spark writes INT96 timestamps by default; Delta (and delta-rs) want TIMESTAMP_MICROS."""
    key = "spark.sql.parquet.outputTimestampType"
    before = spark.conf.get(key)
    spark.conf.set(key, "TIMESTAMP_MICROS")
    try:
        yield
    finally:
        spark.conf.set(key, before)


def _staged_files(fs: pafs.FileSystem, root: str, staging: str) -> list[DataFile]:
    """List what the executors wrote; drop Spark's markers (``_SUCCESS``, ``.crc``)."""
    infos = fs.get_file_info(pafs.FileSelector(f"{root}/{staging}", recursive=True))
    files = []
    for info in infos:
        if info.type != pafs.FileType.File:
            continue
        name = info.base_name
        if name.startswith(("_", ".")) or not name.endswith(".parquet"):
            fs.delete_file(info.path)
            continue
        rel = info.path[len(root) :].lstrip("/")
        partition = {}
        for part in rel.split("/")[1:-1]:
            column, _, value = part.partition("=")
            partition[unquote(column)] = None if value == _HIVE_NULL else unquote(value)
        files.append(replace(describe_data_file(root, rel), partition_values=partition))
    return files


def _discard(fs: pafs.FileSystem, root: str, staging: str) -> None:
    """Delete a staging folder; what cannot be deleted now, vacuum deletes later."""
    with suppress(OSError):
        fs.delete_dir(f"{root}/{staging}")


def write_delta(
    df: Any,
    table_uri: str,
    *,
    app_id: str,
    version: int,
    partition_by: Sequence[str] = (),
    native: bool | None = None,
    table_name: str | None = None,
    before_commit: Callable[[Sequence[DataFile]], None] | None = None,
) -> BridgeWriteResult:
    """Append a Spark DataFrame to a Delta table in ONE commit tagged (app_id, version).

    Executors write the Parquet files; the driver sees only their paths, sizes and
    footers. If the table already records ``version`` (or newer) for ``app_id``,
    nothing is written (checked before the write, and again at commit time, where
    the staged files are deleted). The table is created if it does not exist.

    Args:
        df: the rows to append.
        table_uri: the table's root (a local path or a URI both Spark and delta-rs reach).
        app_id: the idempotency token's application id (e.g. ``<pipeline>/<sink>``).
        version: the token's version (an epoch), ``>= 0``.
        partition_by: partition columns for a table created here (an existing
            table's own partitioning always wins).
        native: use delta-spark's writer; default: only if its JARs are present.
        table_name: how errors name the table (default: the URI).
        before_commit: called with the staged files just before the commit; a fault
            injection point (tests kill the process there).

    Returns:
        Whether this call committed, the Delta version, and the files and rows added.

    Raises:
        InvalidInputError: a written file's schema differs from the table's (naming
            the column); the staged files are deleted and nothing is committed.
        RetryableError: the commit lost to concurrent writers too often; nothing
            was committed and the staged files are deleted.
        OutcomeUnknownError: the commit's outcome is unknown; the staged files are
            kept, since the commit may reference them.
    """
    if native or (native is None and delta_jars_available(df.sparkSession)):
        writer = df.write.format("delta").mode("append").partitionBy(*partition_by)
        writer.option("txnAppId", app_id).option("txnVersion", version).save(table_uri)
        return BridgeWriteResult(committed=True, table_version=None, files=-1, rows=-1)
    from pyspark.sql.pandas.types import to_arrow_schema

    name = table_name or table_uri
    if DeltaTable.is_deltatable(table_uri):
        table = DeltaTable(table_uri)
        already = transaction_version(table, app_id)
        if already is not None and already >= version:
            return BridgeWriteResult(committed=False, table_version=None, files=0, rows=0)
        schema = _arrow_schema(table)
        partitions = list(table.metadata().partition_columns)
    else:
        schema = to_arrow_schema(df.schema, timezone="UTC")
        partitions = list(partition_by)
    fs, root = _filesystem(table_uri)
    staging = (
        f"{_STAGING_PREFIX}{re.sub(r'[^A-Za-z0-9_]', '_', app_id)}-{version}-{uuid.uuid4().hex}"
    )
    writer = df.write.mode("errorifexists").option("compression", "snappy")
    if partitions:
        writer = writer.partitionBy(*partitions)
    with _parquet_timestamps_as_micros(df.sparkSession):
        writer.parquet(f"{table_uri.rstrip('/')}/{staging}")
    try:
        files = _staged_files(fs, root, staging)
        data_schema = pa.schema([f for f in schema if f.name not in partitions])
        check_file_schema(root, files, data_schema, table=name)
        if before_commit is not None:
            before_commit(files)
        commit = DeltaCommit(
            table_uri=root,
            schema=schema,
            app_id=app_id,
            version=version,
            add=files,
            partition_by=partitions,
            check_schema=False,
            table_name=name,
        )
        result = commit_files(commit)
    except OutcomeUnknownError:
        raise  # the commit may reference the files: keep them
    except BaseException:
        _discard(fs, root, staging)
        raise
    if not result.committed:
        _discard(fs, root, staging)
        return BridgeWriteResult(committed=False, table_version=None, files=0, rows=0)
    return BridgeWriteResult(
        committed=True,
        table_version=result.table_version,
        files=len(files),
        rows=sum(f.num_records for f in files),
    )
