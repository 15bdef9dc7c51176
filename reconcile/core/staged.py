"""An epoch's rows staged by Spark executors, where the sink and the store pick them up.

The streaming writer's executors net each partition's rows (one change per
key), write them as change files of the expected-state store and COPY them into
the Postgres sink's own staging table; only this small description
reaches the driver. The commit cycle hands it on like any outputs:

- ``ExpectedState.record`` adds the change files in ONE tokened store commit;
- the Postgres sink's epoch txn upserts the staged rows of the listed task
  attempts into the target with ``INSERT ... SELECT`` and writes its marker.

No row passes through the driver on that path. It is refused anywhere else:
iterating over it raises, so a sink that cannot read the staging table never
takes it for an empty batch.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from reconcile.core.contract import FatalError

__all__ = ["STAGE_EPOCH_COLUMN", "STAGE_TASK_COLUMN", "StagedEpoch"]

# The staging table's own columns, besides the target's: which epoch and which
# task attempt COPied the row (an attempt Spark did not keep is never read).
STAGE_EPOCH_COLUMN = "_reconcile_epoch"
STAGE_TASK_COLUMN = "_reconcile_task"


@dataclass(frozen=True)
class StagedEpoch:
    """One sink's rows of one epoch, staged by executors.

    Attributes:
        sink: the sink's name.
        epoch: the epoch (the micro-batch id).
        columns: the staged columns, in the order the executors wrote them.
        stage: (schema, table) of the Postgres staging table.
        tasks: the task attempts whose rows make the epoch (Spark's successful ones).
        rows: how many rows those attempts staged (one per key: netted).
        store_files: the store change files the attempts wrote, relative to the
            store table's root (empty for a sink without an expected state).
        upserted, deleted: the net changes in those files.
    """

    sink: str
    epoch: int
    columns: tuple[str, ...]
    stage: tuple[str, str]
    tasks: tuple[str, ...]
    rows: int
    store_files: tuple[str, ...] = ()
    upserted: int = 0
    deleted: int = 0

    def __iter__(self) -> Iterator[Any]:
        raise FatalError(
            f"sink {self.sink!r}, epoch {self.epoch}: its rows were staged by Spark executors "
            f"in {'.'.join(self.stage)}; only a Postgres sink reads them from there, and this "
            "sink is not one (stage its rows on the driver instead)",
            epoch=self.epoch,
        )

    def __len__(self) -> int:
        return self.rows
