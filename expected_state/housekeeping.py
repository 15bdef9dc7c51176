"""Compaction and vacuum of a store table, keeping every version recovery may still read."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from deltalake import CommitProperties, DeltaTable, Transaction

from expected_state.fencing import check_generation

if TYPE_CHECKING:
    from expected_state.epochs import EpochLog

__all__ = ["DEFAULT_KEEP_EPOCHS", "DEFAULT_RETENTION_HOURS", "Housekeeping", "VacuumReport"]

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


class Housekeeping:
    """Mixin for :class:`~expected_state.store.ExpectedStateStore`: compact and vacuum."""

    uri: str
    generation: int
    epochs: EpochLog
    _fence: str

    def epoch_versions(self) -> dict[int, int]:  # provided by the store
        raise NotImplementedError

    def last_epoch(self) -> int | None:  # provided by the store
        raise NotImplementedError

    def compact(self, target_size: int | None = None) -> dict[str, Any]:
        """Merge small files of the state table (and the epochs table) into larger ones.

        Compaction changes no data (its commit has dataChange=false), so every
        epoch's snapshot reads the same rows before and after. Its commit carries
        the writer's generation token: a fenced writer cannot compact, and a
        compaction racing an apply() makes one of them fail cleanly instead of
        interleaving.

        Args:
            target_size: target file size in bytes (delta-rs default if None).

        Returns:
            delta-rs' optimize metrics of the state table.

        Raises:
            FencedError: a newer generation has taken over.
        """
        table = DeltaTable(self.uri)
        check_generation(table, self._fence, self.generation, table_name=self.uri)
        metrics = table.optimize.compact(
            target_size=target_size,
            commit_properties=CommitProperties(
                max_commit_retries=3,
                app_transactions=[Transaction(app_id=self._fence, version=self.generation)],
            ),
        )
        # The epochs table is shared append-only; compaction and appends do not conflict.
        if DeltaTable.is_deltatable(self.epochs.uri):
            DeltaTable(self.epochs.uri).optimize.compact(
                commit_properties=CommitProperties(max_commit_retries=3)
            )
        return dict(metrics)

    def vacuum(
        self,
        *,
        keep_from_epoch: int | None = None,
        keep_epochs: int = DEFAULT_KEEP_EPOCHS,
        retention_hours: float = DEFAULT_RETENTION_HOURS,
    ) -> VacuumReport:
        """Delete files no longer needed by the versions that recovery may read.

        Args:
            keep_from_epoch: keep every epoch from this one on (e.g. the last epoch
                verified against the sink). None: only the last ``keep_epochs``.
            keep_epochs: how many of the newest epochs to keep in any case (>= 1).
            retention_hours: minimum age of an unreferenced or removed file before it
                is deleted; 0 is only safe when no apply() is in flight.

        Returns:
            The versions and epochs kept and the files deleted.

        Raises:
            FencedError: a newer generation has taken over.
        """
        table = DeltaTable(self.uri)
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
        return VacuumReport(
            kept_versions=kept_versions, kept_epochs=sorted(keep), deleted_files=list(deleted)
        )
