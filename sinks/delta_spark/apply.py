"""The delta-spark sink's Spark commands: one epoch's staged rows into the table, idempotently.

Every command carries Delta's own transaction identifier, ``(app id, epoch)``:

- an append passes the DataFrameWriter options ``txnAppId`` / ``txnVersion``;
- a MERGE takes no writer options, so the same pair goes in the session
  confs ``spark.databricks.delta.write.txnAppId`` / ``txnVersion`` for the
  duration of the command (Delta's documented way for DML), under a lock,
  and is unset after it whatever happens.

Delta skips a command whose ``txnVersion`` is not above the version its log
records for ``txnAppId``: a replayed epoch writes nothing, whoever replays it.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from reconcile.core.contract import InvalidInputError, RetryableError

__all__ = ["DELETE_COLUMN", "TXN_APP_ID_CONF", "TXN_VERSION_CONF", "apply_epoch", "quote"]

# The staged file's flag column: True for a delete of the row's key.
DELETE_COLUMN = "_reconcile_delete"
TXN_APP_ID_CONF = "spark.databricks.delta.write.txnAppId"
TXN_VERSION_CONF = "spark.databricks.delta.write.txnVersion"
_USER_METADATA_CONF = "spark.databricks.delta.commitInfo.userMetadata"

# The session confs are the session's, not the command's: two sinks on one
# session must not interleave theirs.
_CONF_LOCK = threading.Lock()

# Delta's conflicts: another commit landed first. The next attempt reads the
# log again (the epoch may be in, or a newer generation may hold the table).
_CONFLICTS = (
    "ConcurrentTransactionException",
    "ConcurrentAppendException",
    "ConcurrentDeleteReadException",
    "ConcurrentDeleteDeleteException",
    "ConcurrentWriteException",
    "MetadataChangedException",
    "ProtocolChangedException",
)


def quote(column: str) -> str:
    """``column`` as a Spark SQL identifier (backquoted, inner backquotes doubled)."""
    return "`" + column.replace("`", "``") + "`"


@contextlib.contextmanager
def _txn_confs(spark: Any, confs: Mapping[str, str]) -> Iterator[None]:
    """Set ``confs`` on the session for one command, then unset them, even on failure."""
    with _CONF_LOCK:
        for key, value in confs.items():
            spark.conf.set(key, value)
        try:
            yield
        finally:
            for key in confs:
                spark.conf.unset(key)


def apply_epoch(
    spark: Any,
    uri: str,
    files: Sequence[str],
    *,
    app_id: str,
    epoch: int,
    columns: Sequence[str],
    key: Sequence[str],
    metadata: Mapping[str, Any],
) -> None:
    """Apply the staged Parquet ``files`` to the Delta table at ``uri`` as epoch ``epoch``.

    Args:
        spark: the SparkSession (with Delta's SQL extension).
        uri: the table's root.
        files: absolute paths of the staged files (none: an empty epoch).
        app_id: Delta's ``txnAppId``, the sink's ``<pipeline>/<sink>``.
        epoch: Delta's ``txnVersion``.
        columns: the table's columns, ``_epoch`` included.
        key: the key columns: MERGE by them; empty: append.
        metadata: the ``reconcile.*`` fields, recorded as the commit's userMetadata.

    Raises:
        RetryableError: Delta reported a conflicting commit; nothing was written.
        InvalidInputError: Spark refused the rows (a type or a column); nothing was written.
    """
    from pyspark.errors import AnalysisException

    user_metadata = json.dumps(dict(metadata), sort_keys=True)
    try:
        if files:
            staged = spark.read.parquet(*files)
        else:
            staged = spark.read.format("delta").load(uri).limit(0)
            staged = staged.selectExpr("*", f"false AS {quote(DELETE_COLUMN)}")
        if not key or not files:
            # An append (or an empty epoch, which only records its token):
            # the writer options carry the txn id.
            rows = staged.where(f"NOT {quote(DELETE_COLUMN)}").select(*map(quote, columns))
            (
                rows.write.format("delta")
                .mode("append")
                .option("txnAppId", app_id)
                .option("txnVersion", str(epoch))
                .option("userMetadata", user_metadata)
                .save(uri)
            )
            return
        confs = {
            TXN_APP_ID_CONF: app_id,
            TXN_VERSION_CONF: str(epoch),
            _USER_METADATA_CONF: user_metadata,
        }
        with _txn_confs(spark, confs):
            _merge(spark, uri, staged, columns, key)
    except AnalysisException as exc:
        raise InvalidInputError(
            f"Delta table {uri!r}: Spark refused epoch {epoch}'s rows: {exc}; nothing was written",
            table=uri,
            epoch=epoch,
        ) from exc
    except Exception as exc:
        if any(name in str(exc) for name in _CONFLICTS):
            raise RetryableError(
                f"Delta table {uri!r}: epoch {epoch}'s commit met a concurrent commit "
                f"({type(exc).__name__}); nothing was written"
            ) from exc
        raise


def _merge(spark: Any, uri: str, staged: Any, columns: Sequence[str], key: Sequence[str]) -> None:
    """MERGE ``staged`` into the table by ``key``: delete, update, or insert each row."""
    from delta.tables import DeltaTable

    on = " AND ".join(f"t.{quote(k)} = s.{quote(k)}" for k in key)
    flag = f"s.{quote(DELETE_COLUMN)}"
    values: dict[str, Any] = {quote(c): f"s.{quote(c)}" for c in columns}
    (
        DeltaTable.forPath(spark, uri)
        .alias("t")
        .merge(staged.alias("s"), on)
        .whenMatchedDelete(condition=flag)
        .whenMatchedUpdate(condition=f"NOT {flag}", set=values)
        .whenNotMatchedInsert(condition=f"NOT {flag}", values=values)
        .execute()
    )
