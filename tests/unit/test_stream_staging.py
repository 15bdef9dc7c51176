"""The streaming writer's driver-side pieces that need no Spark: staged files and lost outputs.

``read_staged`` is what stands between the tasks' reports and the epoch: files
holding more or fewer rows than the tasks returned (a dead attempt's file read
by mistake, a torn file) must stop the batch, never be committed. ``outputs_of``
gives the staged rows for its own batch only: an earlier epoch's outputs are
gone, and a sink asking for them must get an error, never an empty batch.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from reconcile.core.contract import FatalError
from reconcile.spark.outputs import outputs_of
from reconcile.spark.staging import read_staged, stage_batches

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string())])


def batch(ids: range) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(
        {"id": list(ids), "name": [f"n{i}" for i in ids]}, schema=SCHEMA
    )


def test_staged_files_are_read_back_whole_and_an_empty_task_leaves_none(tmp_path: Path) -> None:
    first = stage_batches(str(tmp_path), [batch(range(0, 3)), batch(range(3, 5))])
    second = stage_batches(str(tmp_path), [batch(range(5, 6))])
    assert stage_batches(str(tmp_path), []) is None
    assert first is not None and second is not None
    assert len(list(tmp_path.iterdir())) == 2
    table = read_staged([first[0], second[0]], 6, SCHEMA, batch_id=4, sink="s")
    assert table.column("id").to_pylist() == list(range(6))
    assert read_staged([], 0, SCHEMA, batch_id=4, sink="s").num_rows == 0


def test_files_that_disagree_with_the_tasks_stop_the_batch(tmp_path: Path) -> None:
    staged = stage_batches(str(tmp_path), [batch(range(4))])
    assert staged is not None
    with pytest.raises(FatalError, match=r"micro-batch 7, sink 's'.*hold 4 rows.*reported 3"):
        read_staged([staged[0]], 3, SCHEMA, batch_id=7, sink="s")


def test_the_outputs_of_an_earlier_batch_are_an_error_never_an_empty_batch() -> None:
    rows = pa.table({"id": [1]})
    outputs = outputs_of("shop", 5, {"events": rows})
    assert outputs(5)["events"] is rows
    gone = outputs(4)
    assert list(gone) == []  # no sink is addressed: nothing undeclared
    with pytest.raises(FatalError, match=r"epoch 4 is committed but not in sink 'events'"):
        gone.get("events", ())  # how a replay asks for a sink's rows
