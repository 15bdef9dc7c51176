"""A store table's state in Spark: its raw rows through the Spark bridge, merged by the rule.

A plain read of a store table returns its base and its change files as rows;
the state is, per key, the row of the highest ``_epoch``, unless that row's
``_op`` is ``"delete"``. This applies that rule with a window function, so any
Spark job (with or without delta-spark's JARs) reads what the store's
``snapshot()`` returns.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from expected_state.layout import EPOCH_COLUMN, OP_COLUMN
from expected_state.spark_bridge import read_delta
from reconcile.core.contract import InvalidInputError

__all__ = ["read_state"]


def read_state(
    spark: Any,
    table_uri: str,
    key_columns: Sequence[str],
    version: int | None = None,
    *,
    native: bool | None = None,
) -> Any:
    """The state held by a store table (at a Delta version) as a Spark DataFrame.

    Args:
        spark: the SparkSession.
        table_uri: the store table (``<root>/<pipeline>/<sink>``).
        key_columns: the table's key columns.
        version: the Delta version (``store.version_of(epoch)``); default: the newest.
        native: use delta-spark's reader (None: if its JARs are there).

    Returns:
        One row per live key: the key and value columns, ``_row_hash`` and ``_epoch``.

    Raises:
        InvalidInputError: no key column given, or no such table or version.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    if not key_columns:
        raise InvalidInputError(f"table {table_uri!r}: read_state needs the key columns")
    rows = read_delta(spark, table_uri, version, native=native)
    newest_first = Window.partitionBy(*key_columns).orderBy(F.col(EPOCH_COLUMN).desc())
    return (
        rows.withColumn("_newest", F.row_number().over(newest_first))
        .filter((F.col("_newest") == 1) & (F.col(OP_COLUMN) == "upsert"))
        .drop("_newest", OP_COLUMN)
    )
