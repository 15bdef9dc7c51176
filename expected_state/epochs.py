"""The epochs of one sink table in the store's shared ``_epochs`` Delta table (``EpochLog``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from deltalake import DeltaTable

from expected_state.delta_commit import BasedOn, DeltaCommit, commit_files
from expected_state.delta_log import transaction_version
from expected_state.epoch_rows import EPOCHS_SCHEMA, EPOCHS_TABLE, EpochRows
from expected_state.fencing import check_generation, fence_app_id, validate_generation
from reconcile.core.contract import InvalidInputError, validate_name

__all__ = ["EPOCHS_SCHEMA", "EPOCHS_TABLE", "EpochLog", "EpochRecord"]


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

    Rows are append-only; the newest row of an epoch (by commit order, its
    ``seq``) is its status, whatever the epoch's number: an older epoch can be
    given a new status at any time (an aborted epoch decided again). Recording
    the status an epoch already has is a no-op, checked on the snapshot the
    commit is based on. Every commit carries the sink's fence token, so a
    writer of an older generation cannot record anything after a takeover.

    Several (pipeline, sink) pairs share the table: their commits are appends
    under different tokens, which delta-rs rebases without failing each other.
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
        self._rows = EpochRows(self.root, pipeline, sink, self._fence)
        self._records: dict[int, EpochRecord] = {}

    def _refresh(self, *, create: bool = False) -> DeltaTable | None:
        table, rows = self._rows.refresh(create=create)
        for row in rows.to_pylist():  # only the rows new since the last refresh
            self._fold(row)
        return table

    def _fold(self, row: Mapping[str, object]) -> None:
        record = EpochRecord(
            epoch=int(row["epoch"]),  # type: ignore[call-overload]
            status=str(row["status"]),
            xid=row.get("xid"),  # type: ignore[arg-type]
            generation=int(row["generation"]),  # type: ignore[call-overload]
            delta_version=row.get("delta_version"),  # type: ignore[arg-type]
            rows_upserted=int(row.get("rows_upserted") or 0),  # type: ignore[call-overload]
            rows_deleted=int(row.get("rows_deleted") or 0),  # type: ignore[call-overload]
            recorded_at=row["recorded_at"],  # type: ignore[arg-type]
        )
        self._records[record.epoch] = record

    def record(
        self,
        epoch: int,
        status: str,
        xid: str | None = None,
        counts: Mapping[str, int] | None = None,
        *,
        delta_version: int | None = None,
    ) -> bool:
        """Record ``status`` for ``epoch`` in one fenced Delta commit, unless it already has it.

        Args:
            epoch: the epoch (>= 0).
            status: a short word, e.g. "applied", "committed".
            xid: the sink database's transaction id, if any.
            counts: "upserted" and "deleted" row counts.
            delta_version: the state table's Delta version holding the epoch.

        Returns:
            True if this call recorded it, False if the epoch already had that status.

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
        table = self._refresh(create=True)
        assert table is not None
        check_generation(table, self._fence, self.generation, table_name=self.uri)
        current = self._records.get(epoch)
        if current is not None and current.status == status:
            return False  # the epoch has that status already: re-recording adds no row
        counts = counts or {}
        row = {
            "epoch": epoch,
            "status": status,
            "xid": xid,
            "generation": self.generation,
            "delta_version": delta_version,
            "rows_upserted": int(counts.get("upserted", 0)),
            "rows_deleted": int(counts.get("deleted", 0)),
        }

        def landed() -> bool:
            self._refresh()
            now = self._records.get(epoch)
            return now is not None and now.status == status

        written = self._rows.append(table, [row], generation=self.generation, landed=landed)
        if written is None:
            return False
        for done in written.to_pylist():
            self._fold(done)
        return True

    def records(self) -> list[EpochRecord]:
        """The newest record of every epoch of this (pipeline, sink), oldest epoch first."""
        self._refresh()
        return [self._records[e] for e in sorted(self._records)]

    def status(self, epoch: int) -> str | None:
        """The newest status recorded for ``epoch``, or None."""
        self._refresh()
        record = self._records.get(epoch)
        return None if record is None else record.status

    def last_epoch(self, status: str | None = None) -> int | None:
        """The newest epoch recorded (whose current status is ``status``, if given), or None."""
        self._refresh()
        epochs = [e for e, r in self._records.items() if status is None or r.status == status]
        return max(epochs) if epochs else None

    def claim(self) -> None:
        """Record this writer's generation so that older writers are fenced off.

        Raises:
            FencedError: a newer generation already holds the log.
        """
        table = self._rows.open(create=True)
        assert table is not None
        check_generation(table, self._fence, self.generation, table_name=self.uri)
        if transaction_version(table, self._fence) == self.generation:
            return
        claim = DeltaCommit(
            table_uri=self.uri,
            schema=EPOCHS_SCHEMA,
            app_id=self._fence,
            version=self.generation,
            fence=(self._fence, self.generation),  # a claim never lowers the fence
        )
        commit_files(claim, BasedOn(table))

    def compact(self) -> bool:
        """Rewrite this log's rows as one file holding the newest row of each epoch.

        Returns:
            True if a compaction was committed (False: fewer than two files).

        Raises:
            FencedError: a newer generation has taken over; nothing was written.
            RetryableError: lost to a concurrent compaction of the table; nothing was written.
        """
        table = self._refresh()
        if table is None:
            return False
        check_generation(table, self._fence, self.generation, table_name=self.uri)
        if len(self._rows.files) < 2:
            return False
        kept = [
            {
                "epoch": r.epoch,
                "status": r.status,
                "xid": r.xid,
                "generation": r.generation,
                "delta_version": r.delta_version,
                "rows_upserted": r.rows_upserted,
                "rows_deleted": r.rows_deleted,
                "recorded_at": r.recorded_at,
            }
            for r in (self._records[e] for e in sorted(self._records))
        ]
        written = self._rows.append(
            table, kept, generation=self.generation, remove=self._rows.files, kind="compact"
        )
        return written is not None
