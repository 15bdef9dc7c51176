"""The executor path takes Spark's row hash only where it is the store's, for exactly its rows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from reconcile.spark.staging import ROW_HASH_STAGED, _same_rows, hashed_by_spark
from tests.integration.test_stream_collect import FILES, _inbox, _run

pytestmark = [pytest.mark.integration]

STORE = pa.schema([("id", pa.int64()), ("v", pa.string()), ("price", pa.decimal128(12, 2))])


def test_spark_hashes_the_stores_types_after_exact_widenings_only(spark: Any) -> None:
    same = spark.createDataFrame([], "id long, v string, price decimal(12,2)")
    assert hashed_by_spark(same, STORE) == {}
    # Widened exactly (no value changes): cast in Spark first, then hashed there.
    narrow = spark.createDataFrame([], "id int, v string, price decimal(10,2)")
    assert hashed_by_spark(narrow, STORE) == {"id": "bigint", "price": "decimal(12,2)"}
    # Any other difference may change a value on its way into the store, which
    # hashes the values as it stores them: the tasks hash.
    for other in ("id long, v string, price decimal(12,3)",  # another scale
                  "id long, v string, price decimal(14,2)",  # narrowed
                  "id long, v string, price double",
                  "id long, v binary, price decimal(12,2)",
                  "id long, price decimal(12,2)"):  # fmt: skip
        assert hashed_by_spark(spark.createDataFrame([], other), STORE) is None, other
    # A frame that already has a column of the staged hash's name keeps it its own.
    columns = f"id long, v string, price decimal(12,2), {ROW_HASH_STAGED} long"
    clash = spark.createDataFrame([], columns)
    assert hashed_by_spark(clash, STORE) is None


def _rows(ids: list[int]) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "v": [str(i) for i in ids]})


def test_the_hashes_follow_the_rows_only_when_netting_kept_every_row_in_place() -> None:
    received = _rows([3, 1, 2])
    assert _same_rows(_rows([3, 1, 2]), received, ["id"])
    assert not _same_rows(_rows([1, 2]), _rows([1, 1, 2]), ["id"])  # a key netted away
    assert not _same_rows(_rows([1, 3, 2]), received, ["id"])  # the same rows, moved


def test_a_store_planned_on_the_executors_takes_the_sinks_types_and_spark_hashes_its_rows(
    spark: Any, pg_db: str, tmp_path: Path
) -> None:
    """Executors stage every batch; the frame's columns widen exactly to the sink's types."""
    from pyspark.sql import functions as F

    from expected_state.store import ExpectedStateStore
    from reconcile.core.hashing import row_hash_arrow

    def noted(batch: Any) -> Any:
        note = F.concat(F.lit("note-é-"), F.col("id").cast("string"))
        return batch.select(
            "id", (F.col("amount") % 1000).cast("int").alias("amount"),
            F.when(F.col("id") % 3 == 0, None).otherwise(note).alias("note"),
            (F.col("amount") / F.lit(8)).cast("decimal(10,3)").alias("share"),
        )  # fmt: skip

    _inbox(tmp_path)
    history = _run(spark, pg_db, tmp_path, transform=noted, collect_max_bytes=0,
                   table="CREATE TABLE events (id bigint PRIMARY KEY, amount bigint, note text, "
                         "share numeric(18,3), _epoch bigint)")  # fmt: skip
    assert [b.via for b in history] == [{"events": "executors"}] * FILES
    store = ExpectedStateStore(str(tmp_path / "store"), "shop", "events", ["id"])
    snapshot = store.snapshot()
    user = store.user_schema.names  # type: ignore[union-attr]
    # The store took the sink's types (planned before the cycle bound the sink), and
    # Spark cast the frame's int and decimal(10,3) to them before it hashed.
    assert store.user_schema == pa.schema(  # type: ignore[union-attr]
        [("id", pa.int64()), ("amount", pa.int64()), ("note", pa.string()),
         ("share", pa.decimal128(18, 3))]
    )  # fmt: skip
    assert snapshot.num_rows > 0 and snapshot.column("note").null_count > 0
    assert snapshot.column("_row_hash").to_pylist() == row_hash_arrow(snapshot, user).to_pylist()
