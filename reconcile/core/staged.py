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

from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeGuard

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]

from reconcile.core.contract import ConfigurationError, FatalError
from reconcile.core.sink import capabilities_of

__all__ = [
    "STAGE_EPOCH_COLUMN",
    "STAGE_TASK_COLUMN",
    "SharedStage",
    "SharedStaging",
    "StageTarget",
    "StageUnavailable",
    "StagedEpoch",
    "has_shared_stage",
]

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


class StageUnavailable(ConfigurationError):
    """The executors' staging table cannot be used safely; the driver path still can."""


class SharedStage(Protocol):
    """A sink's staging table that executors COPY into; it pickles into every task."""

    @property
    def table(self) -> tuple[str, str]:
        """(schema, table) of the staging table (``StagedEpoch.stage``)."""
        ...

    def copy(self, epoch: int, task: str, rows: pa.Table) -> None:
        """On an executor: add a task attempt's rows (netted, one per key) and commit them."""
        ...

    def sweep(self, through_epoch: int, application_name: str) -> int:
        """Delete the staged rows of epochs up to ``through_epoch``; how many."""
        ...


class StageTarget(Protocol):
    """A sink's target table as the executors' staging path plans it."""

    @property
    def display(self) -> str:
        """The table's name in messages (``schema.table``)."""
        ...

    @property
    def key(self) -> Sequence[str]:
        """Its key columns, by which the sink nets rows."""
        ...

    @property
    def columns(self) -> Collection[str]:
        """Its column names."""
        ...

    def open_stage(self, pipeline: str) -> SharedStage:
        """The staging table of (``pipeline``, the sink, this table), created and checked.

        Raises:
            StageUnavailable: it cannot be used safely (the message says why).
        """
        ...

    def arrow_schema(self) -> pa.Schema:
        """Its columns as the expected state records them (the sink's ``arrow_schema()``)."""
        ...


class SharedStaging(Protocol):
    """What a sink whose capabilities say ``shared_stage`` offers the streaming writer."""

    @property
    def append_only(self) -> bool:
        """Rows are only inserted (no key to net by): the executors cannot stage them."""
        ...

    def stage_target(self) -> StageTarget:
        """Its target table, read from its system (without binding the sink)."""
        ...


def has_shared_stage(sink: object) -> TypeGuard[SharedStaging]:
    """Whether ``sink`` has a staging table executors can fill (``capabilities.shared_stage``)."""
    return capabilities_of(sink).shared_stage
