"""The streaming writer on Spark into a ``delta+spark://`` sink, on the shared Spark session.

The sink is opened by URI (``sinks.registry``), as a pipeline's config names
it; its commits run on the query's own session. The table is read back with
Spark and with delta-rs, and its log's tokens are checked.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from tests.fix_delta_spark import epoch_commits

pytestmark = [pytest.mark.integration]


def _inbox(root: Path) -> None:
    """Two files, one micro-batch each: ids 0..9, then ids 5..14 with new amounts."""
    inbox = root / "inbox"
    inbox.mkdir()
    start = time.time() - 100
    for f, ids in enumerate([range(10), range(5, 15)]):
        path = inbox / f"part-{f}.json"
        path.write_text("".join(json.dumps({"id": i, "amount": i * 10 + f}) + "\n" for i in ids))
        os.utime(path, (start + f, start + f))  # Spark takes the older file first


def _run(spark: Any, root: Path) -> None:
    from reconcile import CommitCycle
    from reconcile.spark.stream import write_stream
    from sinks.registry import open_sink

    def build() -> CommitCycle:
        sink = open_sink("events", f"delta+spark://{root}/tables?key=id")
        return CommitCycle("shop", [sink], root / "state")

    frame = (
        spark.readStream.schema("id long, amount long")
        .option("maxFilesPerTrigger", 1)
        .json(str(root / "inbox"))
    )
    query = write_stream(
        frame, build, checkpoint=root / "checkpoint", staging=root / "staging",
        trigger={"availableNow": True},
    )  # fmt: skip
    query.awaitTermination()
    query.reconcile_writer.close()
    assert query.exception() is None


def test_the_streaming_writer_upserts_into_a_delta_spark_sink_once(
    spark: Any, tmp_path: Path
) -> None:
    _inbox(tmp_path)
    _run(spark, tmp_path)
    uri = str(tmp_path / "tables" / "events")
    want = [(i, i * 10, 0) for i in range(5)] + [(i, i * 10 + 1, 1) for i in range(5, 15)]
    read = spark.read.format("delta").load(uri).collect()
    assert sorted((r["id"], r["amount"], r["_epoch"]) for r in read) == want
    rows = DeltaTable(uri).to_pyarrow_table().to_pylist()
    assert sorted((r["id"], r["amount"], r["_epoch"]) for r in rows) == want
    assert epoch_commits(Path(uri), "events") == {0: 1, 1: 1}  # one commit per micro-batch
    _run(spark, tmp_path)  # nothing new: nothing written
    assert epoch_commits(Path(uri), "events") == {0: 1, 1: 1}
