"""The epochs table: one small Delta table per store recording each (pipeline, sink) epoch."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
import pyarrow.compute as pc  # type: ignore[import-untyped, unused-ignore]
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from expected_state.delta_commit import commit_files, write_data_file
from expected_state.fencing import check_generation, fence_app_id, validate_generation
from reconcile.contract import InvalidInputError, validate_name

__all__ = ["EPOCHS_SCHEMA", "EPOCHS_TABLE", "EpochLog", "EpochRecord"]

EPOCHS_TABLE = "_epochs"

EPOCHS_SCHEMA = pa.schema(
    [
        pa.field("pipeline", pa.string(), nullable=False),
        pa.field("sink", pa.string(), nullable=False),
        pa.field("epoch", pa.int64(), nullable=False),
        pa.field("status", pa.string(), nullable=False),
        pa.field("xid", pa.string()),
        pa.field("generation", pa.int64(), nullable=False),
        pa.field("delta_version", pa.int64()),
        pa.field("rows_upserted", pa.int64(), nullable=False),
        pa.field("rows_deleted", pa.int64(), nullable=False),
        pa.field("recorded_at", pa.timestamp("us", tz="UTC"), nullable=False),
    ]
)


@dataclass(frozen=True, slots=True)
class EpochRecord:
    """The newest record of one epoch of one (pipeline, sink)."""

    epoch: int
    status: str
    xid: str | None
    generation: int
    delta_version: int | None
    rows_upserted: int
    rows_deleted: int
    recorded_at: datetime


class EpochLog:
    """The epochs of one (pipeline, sink) in the store's shared ``_epochs`` Delta table.

    Rows are append-only; the newest row of an epoch wins. Every record is one
    Delta commit tagged ``Transaction("<pipeline>/<sink>#<status>", epoch)``, so
    re-recording the same status for the same epoch is a no-op. Per status,
    epochs are recorded in increasing order (an epoch at or below the newest
    recorded one for that status is treated as already recorded).

    Several (pipeline, sink) pairs share the table: their commits are blind
    appends, which delta-rs rebases on conflict, so concurrent writers of
    different sinks do not fail each other.
    """

    def __init__(self, root: str, pipeline: str, sink: str, *, generation: int = 0) -> None:
        """Open the log of ``pipeline``/``sink`` under store ``root``.

        Args:
            root: the store root (path or URI).
            pipeline: pipeline name.
            sink: sink (table) name.
            generation: this writer's fencing generation.
        """
        self.root = root.rstrip("/")
        self.uri = f"{self.root}/{EPOCHS_TABLE}"
        self.pipeline = validate_name("pipeline", pipeline)
        self.sink = validate_name("sink", sink)
        self.generation = validate_generation(generation)
        self._fence = fence_app_id(pipeline, sink)
        self._table: DeltaTable | None = None

    def record(
        self,
        epoch: int,
        status: str,
        xid: str | None = None,
        counts: Mapping[str, int] | None = None,
        *,
        delta_version: int | None = None,
    ) -> bool:
        """Record ``status`` for ``epoch`` in one idempotent Delta commit.

        Args:
            epoch: the epoch (>= 0).
            status: a short word, e.g. "applied", "committed".
            xid: the sink database's transaction id, if any.
            counts: "upserted" and "deleted" row counts.
            delta_version: the state table's Delta version holding the epoch.

        Returns:
            True if this call recorded it, False if it was already recorded.

        Raises:
            InvalidInputError: a bad epoch or status; nothing was written.
            FencedError: a newer generation has taken over; nothing was written.
            RetryableError: lost to concurrent writers too often; nothing was written.
        """
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise InvalidInputError(
                f"table {self.uri!r}: epoch must be an int >= 0, got {epoch!r}; nothing was written"
            )
        validate_name("status", status)
        app_id = f"{self.pipeline}/{self.sink}#{status}"
        table = self._open() or _create(self.uri)
        check_generation(table, self._fence, self.generation, table_name=self.uri)
        recorded = table.transaction_version(app_id)
        if recorded is not None and recorded >= epoch:
            return False  # already recorded: re-recording must not add a row
        counts = counts or {}
        row = pa.table(
            {
                "pipeline": [self.pipeline],
                "sink": [self.sink],
                "epoch": [epoch],
                "status": [status],
                "xid": [xid],
                "generation": [self.generation],
                "delta_version": [delta_version],
                "rows_upserted": [int(counts.get("upserted", 0))],
                "rows_deleted": [int(counts.get("deleted", 0))],
                "recorded_at": [datetime.now(UTC)],
            },
            schema=EPOCHS_SCHEMA,
        )
        data_file = write_data_file(
            self.uri, f"part-{self.pipeline}-{self.sink}-e{epoch}-{uuid.uuid4().hex}.parquet", row
        )
        result = commit_files(
            self.uri,
            [data_file],
            EPOCHS_SCHEMA,
            app_id=app_id,
            version=epoch,
            fence=(self._fence, self.generation),  # checked on `table`, the commit's snapshot
            check_schema=False,  # we wrote the file from EPOCHS_SCHEMA just above
            table_name=self.uri,
            table=table,
        )
        return result.committed

    def records(self) -> list[EpochRecord]:
        """The newest record of every epoch of this (pipeline, sink), oldest epoch first."""
        table = self._open()
        if table is None:
            return []
        data = table.to_pyarrow_table(
            filters=[("pipeline", "=", self.pipeline), ("sink", "=", self.sink)]
        )
        if data.num_rows == 0:
            return []
        data = data.sort_by([("epoch", "ascending"), ("recorded_at", "ascending")])
        newest: dict[int, EpochRecord] = {}
        for row in data.to_pylist():
            newest[row["epoch"]] = EpochRecord(
                epoch=row["epoch"],
                status=row["status"],
                xid=row["xid"],
                generation=row["generation"],
                delta_version=row["delta_version"],
                rows_upserted=row["rows_upserted"],
                rows_deleted=row["rows_deleted"],
                recorded_at=row["recorded_at"],
            )
        return [newest[e] for e in sorted(newest)]

    def status(self, epoch: int) -> str | None:
        """The newest status recorded for ``epoch``, or None."""
        for record in self.records():
            if record.epoch == epoch:
                return record.status
        return None

    def last_epoch(self, status: str | None = None) -> int | None:
        """The newest epoch recorded (with ``status``, if given), or None."""
        table = self._open()
        if table is None:
            return None
        if status is not None:
            return table.transaction_version(f"{self.pipeline}/{self.sink}#{status}")
        data = table.to_pyarrow_table(
            columns=["epoch"],
            filters=[("pipeline", "=", self.pipeline), ("sink", "=", self.sink)],
        )
        if data.num_rows == 0:
            return None
        value = pc.max(data["epoch"]).as_py()
        return int(value)

    def claim(self) -> None:
        """Record this writer's generation so that older writers are fenced off.

        Raises:
            FencedError: a newer generation already holds the log.
        """
        table = self._open() or _create(self.uri)
        check_generation(table, self._fence, self.generation, table_name=self.uri)
        if table.transaction_version(self._fence) == self.generation:
            return
        commit_files(
            self.uri,
            [],
            EPOCHS_SCHEMA,
            app_id=self._fence,
            version=self.generation,
            fence=(self._fence, self.generation),  # a claim never lowers the fence
            table_name=self.uri,
            table=table,
        )

    def _open(self) -> DeltaTable | None:
        """The epochs table at its newest version (cached, updated incrementally)."""
        if self._table is not None:
            self._table.update_incremental()
            return self._table
        try:
            self._table = DeltaTable(self.uri)
        except TableNotFoundError:
            return None
        return self._table


def _create(uri: str) -> DeltaTable:
    """Create the epochs table if absent (``ignore``: a concurrent creator wins harmlessly)."""
    DeltaTable.create(
        uri,
        EPOCHS_SCHEMA,
        mode="ignore",
        configuration={"delta.checkpointInterval": "10"},
    )
    return DeltaTable(uri)
