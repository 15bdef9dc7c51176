"""The commit cycle's progress log in the store's ``_epochs`` Delta table (``StoreProgressLog``).

One pipeline's statuses are one stream of the epochs table (``sink`` =
``"*"``): status rows appended blind, the newest row of an epoch (by commit
order) winning. Every commit is checked on the snapshot it is based on and
carries the pipeline's fence token ``Transaction("<pipeline>#generation",
generation)``, so a zombie whose check passed still fails if a newer
generation claims before its commit lands.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
import pyarrow.compute as pc  # type: ignore[import-untyped, unused-ignore]
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from expected_state.delta_commit import BasedOn, DeltaCommit, commit_files
from expected_state.delta_files import read_data_files
from expected_state.delta_log import EPOCHS_LOG_MARGIN, prune_log
from expected_state.epoch_rows import EPOCHS_SCHEMA, EPOCHS_TABLE, PIPELINE_STREAM, EpochRows
from reconcile.core.contract import (
    ConfigurationError,
    InvalidInputError,
    RetryableError,
    validate_name,
)
from reconcile.core.progress import EpochStatus, ProgressState, StateBackedLog

__all__ = ["StoreProgressLog", "progress_fence_id", "read_store_progress", "store_pipelines"]

log = logging.getLogger(__name__)

# Statuses of rows that are not an epoch's status but compaction's bookkeeping.
_HORIZON = "horizon"  # epochs below this were truncated (their status is UNKNOWN)
_LAST = "last"  # the newest committed epoch, whose own row may be truncated
_CLAIM_ATTEMPTS = 10


def progress_fence_id(pipeline: str) -> str:
    """The app id under which a pipeline's progress-log writers record their generation."""
    return f"{pipeline}#generation"


def _entry(row: Mapping[str, Any]) -> dict[str, Any]:
    """A status row as a :class:`ProgressState` entry."""
    status = row["status"]
    if status == _HORIZON:
        return {"t": "horizon", "epoch": int(row["epoch"]), "gen": int(row["generation"])}
    if status == _LAST:
        return {"t": "last", "epoch": int(row["epoch"])}
    return {
        "t": "epoch",
        "epoch": int(row["epoch"]),
        "status": status,
        "gen": int(row["generation"]),
    }


def _row(entry: Mapping[str, Any], generation: int) -> dict[str, Any]:
    """A :class:`ProgressState` entry as a status row."""
    kind = entry["t"]
    status = entry["status"] if kind == "epoch" else _HORIZON if kind == "horizon" else _LAST
    return {"epoch": entry["epoch"], "status": status, "generation": entry.get("gen", generation)}


class StoreProgressLog(StateBackedLog):
    """A pipeline's progress log in the expected-state store (the ``ProgressLog`` protocol).

    * ``log_id`` is the epochs table's Delta identity (``metaData.id``, a UUID
      written once when the table is created, never changed): a wiped and
      recreated store gets a new one.
    * ``claim_generation()`` commits the next generation as the fence token; a
      concurrent claim of the same number conflicts in delta-rs and the loser
      claims the next one.
    * ``mark(epoch, status, generation)`` checks the move on the snapshot it
      commits on (the same state machine as every progress log) and appends one
      row; ``mark_many`` appends several moves in ONE commit, e.g.
      ``[(e, DECIDED), (e, COMMITTED), (e - 1, FINALIZED)]``: one commit per epoch.
    * It compacts itself: once the stream has ``compact_after_files`` files (32), the
      next FINALIZED mark rewrites it as one file, keeping the newest
      ``keep_epochs`` finalized epochs and every epoch not finalized yet (older
      ones read as UNKNOWN afterwards).

    What every log backend shares (the reads, ``claim_generation`` and
    ``truncate`` over ``_append``) comes from ``StateBackedLog``; this class
    keeps the state in step with the Delta table and appends to it.
    """

    def __init__(
        self,
        root: str,
        pipeline: str,
        *,
        compact_after_files: int = 32,
        keep_epochs: int = 1_000,
    ) -> None:
        """The progress log of ``pipeline`` in the store at ``root`` (created on first use).

        Args:
            root: the store root (path or URI).
            pipeline: pipeline name ([A-Za-z0-9_]).
            compact_after_files: compact the stream once it has this many files.
            keep_epochs: finalized epochs a compaction keeps.

        Raises:
            ConfigurationError: a bad pipeline name.
            InvalidInputError: a bound below 1.
        """
        self.pipeline = validate_name("pipeline", pipeline)
        if compact_after_files < 2 or keep_epochs < 1:
            raise InvalidInputError("compact_after_files must be >= 2 and keep_epochs >= 1")
        self.root = str(root).rstrip("/")
        self.compact_after_files = compact_after_files
        self.keep_epochs = keep_epochs
        self._rows = EpochRows(self.root, pipeline, PIPELINE_STREAM, progress_fence_id(pipeline))
        self.uri = self._rows.uri
        self._state = ProgressState()
        # The snapshot the state was last brought up to: what StateBackedLog's
        # checks were made on, and so what its _append commits on.
        self._snapshot: DeltaTable | None = None

    # -- reading ---------------------------------------------------------------

    def _table(self, *, create: bool = False) -> DeltaTable | None:
        """Bring the state up to the table's newest snapshot, and return that snapshot."""
        table, rows = self._rows.refresh(create=create)
        self._snapshot = table
        if table is None:
            return None
        for row in rows.to_pylist():  # only the rows new since the last refresh, in order
            self._state.apply(_entry(row))
        recorded = self._rows.generation(table)
        if recorded is not None:
            self._state.generation = max(self._state.generation, recorded)
        if self._state.log_id is None:
            self._state.log_id = str(table.metadata().id)
        return table

    def _refresh(self) -> None:
        """Pick up what other writers appended (StateBackedLog's reads call it)."""
        self._table()

    @property
    def log_id(self) -> str:
        """The log's identity: the epochs table's Delta id, fixed when it was created."""
        self._table(create=True)
        assert self._state.log_id is not None
        return self._state.log_id

    def committed_by(self, epoch: int) -> int | None:
        """The generation that passed ``epoch``'s commit point, if known."""
        self._refresh()
        return self._state.committed_by.get(epoch)

    def read_state(self) -> ProgressState | None:
        """The log as it stands, read without creating anything (None: no epochs table)."""
        return self._state if self._table() is not None else None

    # -- writing ---------------------------------------------------------------

    def _append(self, entry: dict[str, Any]) -> dict[str, Any]:
        """Persist one entry for StateBackedLog: a generation claim, or a status row.

        A status row (a truncation's horizon) is committed on the snapshot the
        caller's checks were made on, with the fence token of its generation.

        Raises:
            FencedError: a newer generation holds the log; nothing was written.
            RetryableError: lost to concurrent writers; nothing was written.
        """
        if entry["t"] == "gen":
            return {"t": "gen", "gen": self._claim()}
        table = self._snapshot or self._table(create=True)
        assert table is not None
        generation = int(entry["gen"])
        if self._rows.append(table, [_row(entry, generation)], generation=generation) is not None:
            self._state.apply(entry)
        return entry

    def _claim(self) -> int:
        """Start a new writer generation and fence every older one. Returns it.

        Raises:
            RetryableError: lost to concurrent claims too often; nothing was claimed.
        """
        for _ in range(_CLAIM_ATTEMPTS):
            table = self._table(create=True)
            assert table is not None
            new = self._state.generation + 1
            try:
                claim = DeltaCommit(
                    table_uri=self.uri,
                    schema=EPOCHS_SCHEMA,
                    app_id=self._rows.fence_id,
                    version=new,
                    fence=(self._rows.fence_id, new),
                )
                result = commit_files(claim, BasedOn(table))
            except RetryableError:
                continue  # a concurrent commit of this pipeline: read again, claim again
            if result.committed:
                self._state.generation = new
                return new
            # Another writer claimed `new` first: ours is the next one.
        raise RetryableError(
            f"progress log {self.uri!r}: pipeline {self.pipeline!r} could not claim a "
            f"generation in {_CLAIM_ATTEMPTS} attempts (concurrent claims); nothing was claimed",
            pipeline=self.pipeline,
        )

    def mark(self, epoch: int, status: EpochStatus, generation: int) -> None:
        """Durably move ``epoch`` to ``status`` (one commit). Idempotent.

        Raises:
            FatalError: an illegal move; nothing was written.
            FencedError: ``generation`` is not the newest; nothing was written.
            RetryableError: lost to concurrent writers; nothing was written.
        """
        self.mark_many([(epoch, status)], generation)

    def mark_many(self, moves: Iterable[tuple[int, EpochStatus]], generation: int) -> None:
        """Make every move, in order, in ONE commit; moves already made are skipped.

        Every move is checked before anything is written: one illegal move and
        none is made.

        Args:
            moves: ``(epoch, status)`` pairs, applied in order.
            generation: the writer's generation.

        Raises:
            FatalError: an illegal move (naming it); nothing was written.
            FencedError: ``generation`` is not the newest; nothing was written.
            RetryableError: lost to concurrent writers; nothing was written.
        """
        moves = [(epoch, EpochStatus(status)) for epoch, status in moves]
        table = self._table(create=True)
        assert table is not None
        self._state.check_generation(generation)
        # Check the moves one after another on a scratch state holding only the
        # epochs they touch, so that a later move sees the earlier ones.
        scratch = ProgressState(
            generation=self._state.generation,
            horizon=self._state.horizon,
            statuses={e: self._state.statuses[e] for e, _ in moves if e in self._state.statuses},
        )
        entries: list[dict[str, Any]] = []
        wanted: dict[int, EpochStatus] = {}
        for epoch, status in moves:
            if scratch.check_move(epoch, status):
                entry = {"t": "epoch", "epoch": epoch, "status": status.value, "gen": generation}
                scratch.apply(entry)
                entries.append(entry)
                wanted[epoch] = status
        if not entries:
            return

        def landed() -> bool:
            self._table()
            return all(self._state.status_of(e) is s for e, s in wanted.items())

        rows = [_row(e, generation) for e in entries]
        if self._rows.append(table, rows, generation=generation, landed=landed) is not None:
            for entry in entries:
                self._state.apply(entry)
        if (
            EpochStatus.FINALIZED in wanted.values()
            and self._rows.file_count() >= self.compact_after_files
        ):
            try:
                self.compact(generation)
            except RetryableError as exc:
                # The marks are in; compaction only bounds the log. Try again later.
                log.info("progress log %s: compaction deferred: %s", self.uri, exc)

    def compact(self, generation: int, keep_epochs: int | None = None) -> bool:
        """Rewrite the pipeline's rows as one file holding its state alone.

        Keeps the newest ``keep_epochs`` finalized epochs and every epoch that is
        not finalized, the newest committed epoch, and which generation passed
        each kept commit point; older epochs read as UNKNOWN afterwards.

        Returns:
            True if a compaction was committed.

        Raises:
            FencedError: ``generation`` is not the newest; nothing was written.
            RetryableError: lost to a concurrent compaction of the table; nothing was written.
        """
        table = self._table()
        if table is None:
            return False
        self._state.check_generation(generation)
        horizon = self._state.compaction_horizon(keep_epochs or self.keep_epochs)
        entries = [e for e in self._state.snapshot(horizon) if e["t"] not in ("id", "gen")]
        removed = list(self._rows.files)
        if not removed:
            return False
        written = self._rows.append(
            table,
            [_row(e, generation) for e in entries],
            generation=generation,
            remove=removed,
            kind="compact",
        )
        if written is None:
            return False
        for entry in entries:
            self._state.apply(entry)
        # Every commit lists the log folder: keep it short (a margin of versions
        # stays for writers of other streams whose snapshot is a little behind).
        prune_log(self.uri, table.version() - EPOCHS_LOG_MARGIN)
        return True


# -- reading without a writer (``reconcile status``) -----------------------------


def store_pipelines(root: str) -> list[str]:
    """The pipelines whose progress log is in the store at ``root``, sorted (reads only).

    A pipeline counts once it has a status row; one that only claimed a
    generation (and never marked an epoch) is not listed.
    """
    uri = f"{str(root).rstrip('/')}/{EPOCHS_TABLE}"
    try:
        table = DeltaTable(uri)
    except TableNotFoundError:
        return []
    paths = pa.table(table.get_add_actions(flatten=False)).column("path").to_pylist()
    if not paths:
        return []
    rows = read_data_files(uri, paths, columns=["pipeline", "sink"], schema=EPOCHS_SCHEMA)
    ours = rows.filter(pc.equal(rows.column("sink"), PIPELINE_STREAM))
    return sorted(set(ours.column("pipeline").to_pylist()))


def read_store_progress(root: str, pipeline: str) -> ProgressState:
    """A pipeline's progress log in the store, read without writing anything (for ``status``).

    Nothing is created: not the epochs table, not a generation.

    Args:
        root: the store root (path or URI).
        pipeline: the pipeline's name.

    Returns:
        The log's state: statuses, generation, horizon and ``log_id``.

    Raises:
        ConfigurationError: the store has no progress log of ``pipeline``
            (the message lists the pipelines whose log it holds).
    """
    log = StoreProgressLog(root, pipeline)
    state = log.read_state()
    # A pipeline that claimed a generation has a log, even before its first mark.
    if state is not None and (state.statuses or state.generation or state.horizon):
        return state
    held = store_pipelines(root)
    raise ConfigurationError(
        f"no progress log for pipeline {pipeline!r} in the store at {log.root} "
        f"(progress logs there: {held or 'none'})",
        path=log.uri,
    )
