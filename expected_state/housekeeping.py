"""Off the write path: checkpoints, vacuum, and ``maintain()`` that runs what is due."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from deltalake import DeltaTable

from expected_state.compaction import DEFAULT_MERGE_MAX_ROWS, merge_groups
from expected_state.delta_commit import make_durable
from expected_state.delta_log import EPOCHS_LOG_MARGIN, last_checkpoint, prune_log
from expected_state.fencing import check_generation
from expected_state.holds import held_versions, holds_folder
from expected_state.live import live_files
from expected_state.memory import release_freed_memory
from expected_state.vacuum_files import delete_unreferenced
from expected_state.vacuum_record import DEFAULT_VACUUM_LEASE_S, VacuumRunning
from reconcile.core import hooks

if TYPE_CHECKING:
    from expected_state.epochs import EpochLog
    from expected_state.integrity import LogAudit

__all__ = [
    "DEFAULT_CHECKPOINT_EVERY",
    "DEFAULT_COMPACT_CHANGES_AFTER",
    "DEFAULT_KEEP_EPOCHS",
    "DEFAULT_RETENTION_HOURS",
    "DEFAULT_SAFETY_MARGIN_MINUTES",
    "VACUUM_LISTED",
    "Housekeeping",
    "VacuumReport",
]

# After vacuum listed the holds, before it deletes anything: where a reader
# taking its hold races it (tests/integration/test_store_hold_race.py).
VACUUM_LISTED = hooks.declare("expected_state.vacuum.listed")

# Retention (docs/expected_state.md, "Retention"):
#  * the newest version is always kept (recovery's target state T);
#  * the versions of the last DEFAULT_KEEP_EPOCHS epochs are kept, and every
#    epoch from `keep_from_epoch` on (the caller passes the last epoch verified
#    against the sink: scoped recovery diffs against it via changed_keys());
#  * every version a running verify, repair or rebuild holds (expected_state.holds:
#    a record under the table's _holds/, ignored once its lease expired);
#  * files no kept or held version references (those a merge or a compaction
#    rewrote before the kept window, crash orphans, a fenced writer's leftovers)
#    are deleted once older than the safety margin, so that an apply() between
#    its file writes and its commit never loses its files; and older than
#    `retention_hours`, the user's extra retention for other time-travel readers
#    (0 by default: the engine's own readers hold what they read). The versions
#    above are kept whatever their age: the margin and retention protect nothing else.
DEFAULT_KEEP_EPOCHS = 10
DEFAULT_RETENTION_HOURS = 0
# Ten minutes: far longer than an epoch's file writes before its commit (the
# store's own, or Spark executors' change files written while housekeeping runs).
DEFAULT_SAFETY_MARGIN_MINUTES = 10.0
# maintain(): a checkpoint every 10 commits keeps the log replay of each epoch's
# refresh and commit short; merging after 50 epochs keeps the live files few.
DEFAULT_CHECKPOINT_EVERY = 10
DEFAULT_COMPACT_CHANGES_AFTER = 50


@dataclass(frozen=True, slots=True)
class VacuumReport:
    """What :meth:`Housekeeping.vacuum` kept and deleted."""

    kept_versions: list[int]
    kept_epochs: list[int]
    deleted_files: list[str]
    deleted_log_files: int = 0
    epochs_deleted_files: list[str] = field(default_factory=list)


class Housekeeping:
    """Mixin for :class:`~expected_state.store.ExpectedStateStore`: checkpoint, vacuum, maintain."""

    uri: str
    generation: int
    epochs: EpochLog
    _fence: str
    # What the store keeps per epoch and per file (expected_state.reading, .trust):
    # vacuum makes them forget what the pruned log no longer holds.
    _versions: dict[int, int]
    _epoch_files: dict[int, list[str]]
    _history_from: int
    _log_audit: LogAudit | None
    _sound_files: set[str]

    def _delta(self, *, refresh: bool = True) -> DeltaTable | None:  # provided by the store
        raise NotImplementedError

    def epoch_versions(self) -> dict[int, int]:  # provided by the store
        raise NotImplementedError

    def compact_changes(
        self, *, through_epoch: int | None = None, max_rows: int = DEFAULT_MERGE_MAX_ROWS
    ) -> dict[str, Any]:
        raise NotImplementedError  # provided by the store

    def audit(self, version: int | None = None) -> None:  # provided by the store
        raise NotImplementedError

    def checkpoint(self) -> int | None:
        """Write a Delta checkpoint of the newest version, fsynced; return its version.

        A checkpoint is what every refresh and commit replays the log from. The
        write path does not write them (delta-rs would, inside the commit of every
        100th version only, as a backstop): :meth:`maintain` does, between epochs.
        """
        table = self._delta()
        if table is None:
            return None
        table.create_checkpoint()
        version = table.version()
        make_durable(self.uri, version, version)
        return version

    def maintain(
        self,
        *,
        checkpoint_every: int = DEFAULT_CHECKPOINT_EVERY,
        compact_changes_after: int = DEFAULT_COMPACT_CHANGES_AFTER,
        keep_from_epoch: int | None = None,
        keep_epochs: int = DEFAULT_KEEP_EPOCHS,
        retention_hours: float = DEFAULT_RETENTION_HOURS,
        merge_max_rows: int = DEFAULT_MERGE_MAX_ROWS,
        safety_margin_minutes: float = DEFAULT_SAFETY_MARGIN_MINUTES,
    ) -> dict[str, Any]:
        """Run the housekeeping that is due; meant to be called between epochs.

        Cheap when nothing is due (a refresh and a small file read). Due are:
        ``compact_changes()`` then ``vacuum()`` once ``compact_changes_after``
        epochs have a change file of their own that a merge would take (a small
        one, beside another: ``merge_groups``), and a checkpoint once
        ``checkpoint_every`` commits were made since the last one. Folding into
        the base (``compact()``), whose cost follows the table, is left to the
        caller.

        Args:
            checkpoint_every: commits between checkpoints.
            compact_changes_after: epoch change files to merge that trigger a merge and a
                vacuum.
            keep_from_epoch: passed to ``vacuum()`` (the last epoch verified).
            keep_epochs: passed to ``vacuum()``.
            retention_hours: passed to ``vacuum()``.
            merge_max_rows: passed to ``compact_changes()`` as ``max_rows``.
            safety_margin_minutes: passed to ``vacuum()``.

        Returns:
            What ran: ``compact_changes`` and ``vacuum`` reports, ``checkpoint`` version.

        Raises:
            FencedError: a newer generation has taken over.
        """
        table = self._delta()
        done: dict[str, Any] = {}
        if table is None:
            return done
        changes = [f for f in live_files(table, name=self.uri) if f.kind == "change"]
        newest = max((f.epoch for f in changes), default=-1)
        # Counted over the runs a merge would take (the newest epoch keeps its own
        # file, as compact_changes() leaves it): an epoch's file that is large, or
        # alone between large ones, stays as it is and must not make every later
        # call merge (and vacuum) for nothing.
        runs = merge_groups([f for f in changes if f.epoch < newest], merge_max_rows)
        own = [f for run in runs for f in run if not f.merged]
        if len(own) >= compact_changes_after:
            done["compact_changes"] = self.compact_changes(max_rows=merge_max_rows)
            done["vacuum"] = self.vacuum(
                keep_from_epoch=keep_from_epoch,
                keep_epochs=keep_epochs,
                retention_hours=retention_hours,
                safety_margin_minutes=safety_margin_minutes,
            )
            release_freed_memory()  # what the merge and the vacuum read, between epochs
            table = self._delta()
            assert table is not None
        last = last_checkpoint(self.uri)
        if table.version() - (last if last is not None else -1) >= checkpoint_every:
            done["checkpoint"] = self.checkpoint()
        return done

    def vacuum(
        self,
        *,
        keep_from_epoch: int | None = None,
        keep_epochs: int = DEFAULT_KEEP_EPOCHS,
        retention_hours: float = DEFAULT_RETENTION_HOURS,
        safety_margin_minutes: float = DEFAULT_SAFETY_MARGIN_MINUTES,
        lease_s: float = DEFAULT_VACUUM_LEASE_S,
    ) -> VacuumReport:
        """Delete files, and log entries, no longer needed by the versions recovery may read.

        Args:
            keep_from_epoch: keep every epoch from this one on (e.g. the last epoch
                verified against the sink). None: only the last ``keep_epochs``.
            keep_epochs: how many of the newest epochs to keep in any case (>= 1).
            retention_hours: the extra retention (any fraction of an hour, default 0):
                an unreferenced file younger than this is kept, for readers of old
                versions other than the engine's (which hold what they read).
            safety_margin_minutes: an unreferenced file last written more recently is
                kept (an apply() between its file writes and its commit); 0 is only
                safe when no writer of the store is running.
            lease_s: the term of this vacuum's "running" record (renewed every
                quarter of it): a vacuum killed outright keeps readers that took
                a hold meanwhile waiting that long at most.

        Returns:
            The versions and epochs kept, the files and the number of log files deleted
            (of the state table and of the store's epochs table).

        Raises:
            FencedError: a newer generation has taken over.
            RetryableError: its record could not be renewed for half its lease: it
                stopped deleting (what it left goes at the next vacuum).
        """
        table = self._delta()
        if table is None:
            return VacuumReport([], [], [])
        check_generation(table, self._fence, self.generation, table_name=self.uri)
        # The log is pruned below the versions kept: a commit the engine did not
        # write must be found before that, or its effect would be folded into
        # the checkpoint the next audit starts from, unseen.
        self.audit()
        versions = self.epoch_versions()
        epochs = sorted(versions)
        keep = set(epochs[-max(1, keep_epochs) :])
        if keep_from_epoch is not None:
            keep.update(e for e in epochs if e >= keep_from_epoch)
        if retention_hours < 0 or safety_margin_minutes < 0:
            raise ValueError(
                f"table {self.uri!r}: retention_hours and safety_margin_minutes must be >= 0, "
                f"got {retention_hours!r} and {safety_margin_minutes!r}"
            )
        # WHY: the record goes first, the listing after: a reader whose hold this
        # listing misses wrote it after the record, so it sees the record and
        # waits for this vacuum before it trusts its version (vacuum_record).
        with VacuumRunning(self.uri, holds_folder(self.uri), lease_s=lease_s) as running:
            # WHY: a verify, repair or rebuild still reading an old version holds it
            # (expected_state.holds); its files and log entries stay whatever their
            # age. A held version the log no longer has is gone already: not kept.
            held = {v for v in held_versions(self.uri, now=running.stamp)
                    if self._history_from <= v <= table.version()}  # fmt: skip
            hooks.point(VACUUM_LISTED)
            kept_versions = sorted({versions[e] for e in keep} | {table.version()} | held)
            # full (in delete_unreferenced): also files no log entry ever referenced
            # (crash orphans of apply(), a fenced writer's files), not only removed ones.
            deleted = delete_unreferenced(
                table,
                keep_versions=kept_versions,
                retention_hours=retention_hours,
                margin_minutes=safety_margin_minutes,
                check=running.check,
            )
            # Every write lists the log folder, so its cost grows with the log: prune
            # it below the oldest version kept (deltalake's own cleanup goes by age).
            log = prune_log(self.uri, kept_versions[0], check=running.check)
        if log.start is not None:
            self._forget_before(log.start)
        pruned = log.deleted
        epochs_deleted: list[str] = []
        if DeltaTable.is_deltatable(self.epochs.uri):
            # The shared epochs table: nobody reads its old versions, but a writer
            # of another stream may be a few commits behind when it commits, and
            # delta-rs then reads the commits since its snapshot: keep a margin.
            epochs_table = DeltaTable(self.epochs.uri)
            epochs_deleted = delete_unreferenced(
                epochs_table,
                keep_versions=None,
                retention_hours=retention_hours,
                margin_minutes=safety_margin_minutes,
            )
            pruned += prune_log(self.epochs.uri, epochs_table.version() - EPOCHS_LOG_MARGIN).deleted
        return VacuumReport(
            kept_versions=kept_versions,
            kept_epochs=sorted(keep),
            deleted_files=list(deleted),
            deleted_log_files=pruned,
            epochs_deleted_files=epochs_deleted,
        )

    def _forget_before(self, version: int) -> None:
        """Forget the epochs and files that only versions before ``version`` (pruned) knew.

        A store opened now reads its epoch -> version map, and audits its log,
        from the log as vacuum left it: it knows no epoch committed before
        ``version``, nor a file the engine removed by then. This object forgets
        them too, so that a writer running for days holds the epochs and files
        of the kept window, not of every epoch it ever wrote, and answers as a
        reader opened now would (an epoch before the window is "pruned").
        """
        for epoch in [e for e, v in self._versions.items() if v < version]:
            del self._versions[epoch]
            self._epoch_files.pop(epoch, None)
        self._history_from = max(self._history_from, version)
        if self._log_audit is not None:
            self._log_audit.forget_before(version)
            # A file checked once is not checked again: only while the log knows it.
            self._sound_files.intersection_update(self._log_audit.entries)
        else:
            self._sound_files.clear()
