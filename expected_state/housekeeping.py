"""Off the write path: delete the files and log entries no epoch to keep needs (vacuum)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from deltalake import DeltaTable

from expected_state.delta_log import EPOCHS_LOG_MARGIN, prune_log
from expected_state.fencing import check_generation

if TYPE_CHECKING:
    from expected_state.epochs import EpochLog

__all__ = [
    "DEFAULT_KEEP_EPOCHS",
    "DEFAULT_RETENTION_HOURS",
    "Housekeeping",
    "VacuumReport",
]

# Retention (docs/expected_state.md, "Retention"):
#  * the newest version is always kept (recovery's target state T);
#  * the versions of the last DEFAULT_KEEP_EPOCHS epochs are kept, and every
#    epoch from `keep_from_epoch` on (the caller passes the last epoch verified
#    against the sink: scoped recovery diffs against it via changed_keys());
#  * files no version references (crash orphans, a fenced writer's leftovers)
#    are deleted only once older than `retention_hours`, so an apply() that is
#    between its file writes and its commit never loses its files.
DEFAULT_KEEP_EPOCHS = 10
DEFAULT_RETENTION_HOURS = 24


@dataclass(frozen=True, slots=True)
class VacuumReport:
    """What :meth:`Housekeeping.vacuum` kept and deleted."""

    kept_versions: list[int]
    kept_epochs: list[int]
    deleted_files: list[str]
    deleted_log_files: int = 0
    epochs_deleted_files: list[str] = field(default_factory=list)


class Housekeeping:
    """Mixin for :class:`~expected_state.store.ExpectedStateStore`: vacuum."""

    uri: str
    generation: int
    epochs: EpochLog
    _fence: str

    def _delta(self, *, refresh: bool = True) -> DeltaTable | None:  # provided by the store
        raise NotImplementedError

    def epoch_versions(self) -> dict[int, int]:  # provided by the store
        raise NotImplementedError

    def vacuum(
        self,
        *,
        keep_from_epoch: int | None = None,
        keep_epochs: int = DEFAULT_KEEP_EPOCHS,
        retention_hours: float = DEFAULT_RETENTION_HOURS,
    ) -> VacuumReport:
        """Delete files, and log entries, no longer needed by the versions recovery may read.

        Args:
            keep_from_epoch: keep every epoch from this one on (e.g. the last epoch
                verified against the sink). None: only the last ``keep_epochs``.
            keep_epochs: how many of the newest epochs to keep in any case (>= 1).
            retention_hours: minimum age of an unreferenced or removed file before it
                is deleted; 0 is only safe when no apply() is in flight.

        Returns:
            The versions and epochs kept, the files and the number of log files deleted
            (of the state table and of the store's epochs table).

        Raises:
            FencedError: a newer generation has taken over.
        """
        table = self._delta()
        if table is None:
            return VacuumReport([], [], [])
        check_generation(table, self._fence, self.generation, table_name=self.uri)
        versions = self.epoch_versions()
        epochs = sorted(versions)
        keep = set(epochs[-max(1, keep_epochs) :])
        if keep_from_epoch is not None:
            keep.update(e for e in epochs if e >= keep_from_epoch)
        kept_versions = sorted({versions[e] for e in keep} | {table.version()})
        deleted = table.vacuum(
            retention_hours=int(retention_hours),
            dry_run=False,
            enforce_retention_duration=False,
            keep_versions=kept_versions,
            # full: also delete files no log entry ever referenced (crash orphans of
            # apply(), a fenced writer's files); the default "lite" mode only
            # deletes files that a commit removed.
            full=True,
        )
        # Every write lists the log folder, so its cost grows with the log: prune
        # it below the oldest version kept (deltalake's own cleanup goes by age).
        pruned = prune_log(self.uri, kept_versions[0])
        epochs_deleted: list[str] = []
        if DeltaTable.is_deltatable(self.epochs.uri):
            # The shared epochs table: nobody reads its old versions, but a writer
            # of another stream may be a few commits behind when it commits, and
            # delta-rs then reads the commits since its snapshot: keep a margin.
            epochs_table = DeltaTable(self.epochs.uri)
            epochs_deleted = list(
                epochs_table.vacuum(
                    retention_hours=int(retention_hours),
                    dry_run=False,
                    enforce_retention_duration=False,
                    full=True,
                )
            )
            pruned += prune_log(self.epochs.uri, epochs_table.version() - EPOCHS_LOG_MARGIN)
        return VacuumReport(
            kept_versions=kept_versions,
            kept_epochs=sorted(keep),
            deleted_files=list(deleted),
            deleted_log_files=pruned,
            epochs_deleted_files=epochs_deleted,
        )
