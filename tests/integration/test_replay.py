"""The rebuild's replay of a file stream: exactly the micro-batches up to an epoch, in order.

The checkpoint's file source log is written by Spark itself here (a real
stream over real files, ``availableNow``), then replayed through another app:
the micro-batches after the epoch are left out, a key written by two
micro-batches keeps the later one's row, a transform gets each micro-batch
(and its id) alone, and a log that lacks a micro-batch, or a stream of
several sources, is refused naming the checkpoint.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from reconcile.core.contract import ConfigurationError, InvalidInputError
from reconcile.spark.replay import file_source_batches, replay

pytestmark = [pytest.mark.integration]


def _stream(spark: Any, inbox: Path, checkpoint: Path, files: list[list[dict[str, int]]]) -> None:
    """Run a real stream over ``files``, one micro-batch each, so that Spark writes its log."""
    from pyspark.sql import types as T

    inbox.mkdir()
    for number, rows in enumerate(files):
        aside = inbox.parent / f"f{number:03d}.json"
        aside.write_text("".join(json.dumps(r) + "\n" for r in rows))
        os.utime(aside, (1_700_000_000 + number, 1_700_000_000 + number))  # the stream's order
        aside.rename(inbox / aside.name)
    schema = T.StructType([T.StructField("id", T.LongType()), T.StructField("qty", T.LongType())])
    frame = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).json(str(inbox))
    query = (frame.writeStream.format("noop").option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True).start())  # fmt: skip
    query.awaitTermination()


FILES = [
    [{"id": 1, "qty": 1}, {"id": 2, "qty": 2}],
    [{"id": 1, "qty": 10}, {"id": 3, "qty": 3}],
    [{"id": 2, "qty": 20}, {"id": 4, "qty": 4}],
    [{"id": 1, "qty": 100}, {"id": 5, "qty": 5}],
]


@pytest.fixture
def streamed(spark: Any, tmp_path: Path) -> tuple[Path, Path]:
    inbox, checkpoint = tmp_path / "inbox", tmp_path / "checkpoint"
    _stream(spark, inbox, checkpoint, FILES)
    return inbox, checkpoint


def test_the_log_gives_each_micro_batch_its_files_up_to_the_epoch(
    streamed: tuple[Path, Path],
) -> None:
    _, checkpoint = streamed
    batches = file_source_batches(str(checkpoint), through=2)
    assert sorted(batches) == [0, 1, 2]
    assert [[Path(p).name for p in paths] for paths in batches.values()] == [
        ["f000.json"],
        ["f001.json"],
        ["f002.json"],
    ]
    with pytest.raises(ConfigurationError, match=r"lacks micro-batches \[4, 5\]"):
        file_source_batches(str(checkpoint), through=5)


def test_a_replay_keeps_the_later_micro_batchs_row_and_leaves_out_the_later_epochs(
    spark: Any, streamed: tuple[Path, Path]
) -> None:
    from pyspark.sql import functions as F

    inbox, checkpoint = streamed
    seen: list[int] = []

    def app(session: Any) -> tuple[Any, dict[str, Any]]:
        frame = session.readStream.format("json").schema("id bigint, qty bigint").load(str(inbox))

        def doubled(batch: Any, batch_id: int) -> Any:
            seen.append(batch_id)
            # A count within the micro-batch: the same over the union would differ.
            return batch.withColumn("qty", F.col("qty") * 2 + F.lit(batch.count()))

        return frame, {"orders": doubled}

    state = replay(spark, app, str(checkpoint), 2, {"orders": (["id"], ["id", "qty"])})
    rows = {r["id"]: r["qty"] for r in state["orders"].to_pylist()}
    # id 1: micro-batch 1's row (10 * 2 + 2), not 0's nor 3's (after the epoch).
    assert rows == {1: 22, 2: 42, 3: 8, 4: 10}
    assert seen == [0, 1, 2]
    with pytest.raises(InvalidInputError, match=r"sink 'orders'.*lack columns \['total'\]"):
        replay(spark, app, str(checkpoint), 0, {"orders": (["id"], ["id", "total"])})


def test_a_checkpoint_without_one_file_source_is_refused(tmp_path: Path) -> None:
    (tmp_path / "sources" / "0").mkdir(parents=True)
    (tmp_path / "sources" / "1").mkdir(parents=True)
    with pytest.raises(ConfigurationError, match=r"one file source.*\['0', '1'\]"):
        file_source_batches(str(tmp_path), through=0)
    with pytest.raises(ConfigurationError, match="no source log"):
        file_source_batches(str(tmp_path / "nothing"), through=0)


def test_a_retained_input_is_read_whole_as_one_batch_and_its_keys_left_unfolded(
    spark: Any, streamed: tuple[Path, Path]
) -> None:
    inbox, checkpoint = streamed
    seen: list[int] = []

    def app(session: Any) -> tuple[Any, None]:
        frame = session.readStream.schema("id bigint, qty bigint").json(str(inbox))
        seen.append(frame.count())
        return frame, None

    state = replay(spark, app, str(checkpoint), 3, {"orders": (["id"], ["id", "qty"])},
                   retained=str(inbox))  # fmt: skip
    # Every file at once, in one batch: id 1 three times, left for the rebuild to refuse.
    assert seen == [8]
    assert sorted(r["id"] for r in state["orders"].to_pylist()) == [1, 1, 1, 2, 2, 3, 4, 5]


def test_a_source_log_without_a_file_list_asks_for_the_retained_input(tmp_path: Path) -> None:
    (tmp_path / "sources" / "0").mkdir(parents=True)
    (tmp_path / "sources" / "0" / "0").write_text('v1\n{"logOffset":0}\n')
    with pytest.raises(ConfigurationError, match="rebuild_input"):
        file_source_batches(str(tmp_path), through=0)
