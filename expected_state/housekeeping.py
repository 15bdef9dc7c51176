"""Off the write path: fold changes into the base (compact), delete old files and log (vacuum)."""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
from deltalake import DeltaTable

from expected_state.delta_commit import DataFile, commit_files, write_data_file
from expected_state.delta_files import read_data_files
from expected_state.delta_log import EPOCHS_LOG_MARGIN, prune_log
from expected_state.fencing import check_generation
from expected_state.layout import StoreFile, base_file_name, stored_schema
from expected_state.merge import apply_changes
from expected_state.reading import live_files
from reconcile import hooks
from reconcile.contract import InvalidInputError, RetryableError

if TYPE_CHECKING:
    from expected_state.epochs import EpochLog

__all__ = [
    "COMPACT_WRITTEN",
    "DEFAULT_KEEP_EPOCHS",
    "DEFAULT_RETENTION_HOURS",
    "Housekeeping",
    "VacuumReport",
]

log = logging.getLogger(__name__)

# compact() has written the new base files (the long part) and is about to base
# its commit on a fresh snapshot: applies, reverts and takeovers land here.
COMPACT_WRITTEN = hooks.declare("expected_state.compact.written")

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
DEFAULT_TARGET_SIZE = 128 * 1024 * 1024  # bytes of Arrow data per base file
_COMMIT_ATTEMPTS = 4


@dataclass(frozen=True, slots=True)
class VacuumReport:
    """What :meth:`Housekeeping.vacuum` kept and deleted."""

    kept_versions: list[int]
    kept_epochs: list[int]
    deleted_files: list[str]
    deleted_log_files: int = 0
    epochs_deleted_files: list[str] = field(default_factory=list)


def _as_removed(files: list[StoreFile]) -> list[DataFile]:
    return [DataFile(f.path, f.size, 0, "", 0) for f in files]


class Housekeeping:
    """Mixin for :class:`~expected_state.store.ExpectedStateStore`: compact and vacuum."""

    uri: str
    generation: int
    key_columns: list[str]
    epochs: EpochLog
    _fence: str
    _schema: pa.Schema | None

    def _delta(self, *, refresh: bool = True) -> DeltaTable | None:  # provided by the store
        raise NotImplementedError

    def _token(self, table: DeltaTable) -> int | None:  # provided by the store
        raise NotImplementedError

    def epoch_versions(self) -> dict[int, int]:  # provided by the store
        raise NotImplementedError

    def compact(
        self, target_size: int | None = None, *, through_epoch: int | None = None
    ) -> dict[str, Any]:
        """Fold the change files of epochs up to ``through_epoch`` into a new base.

        Never called by ``apply()``: the write path only appends. The new base is
        computed and written on one snapshot (the long part), then committed on a
        fresh one after checking, there, that every file it replaces is still live
        and that no change of a folded epoch appeared (a revert, or another
        compaction, changes that: RetryableError, nothing written). An apply that
        lands meanwhile only adds a later epoch's file, which stays. The commit
        carries the writer's fence token and ``dataChange=false``: every epoch's
        snapshot reads the same state before and after, by merge-on-read. The
        table's own epochs log is compacted too.

        Args:
            target_size: about how many bytes of Arrow data per base file.
            through_epoch: fold epochs up to this one. Default: all but the newest,
                which stays revertible (``revert()`` of a folded epoch is refused).

        Returns:
            ``through_epoch``, ``folded_epochs``, ``files_removed``, ``files_added``,
            ``rows`` (of the new base) and ``seconds``.

        Raises:
            FencedError: a newer generation has taken over; nothing was written.
            InvalidInputError: ``through_epoch`` is after the newest epoch.
            RetryableError: the table changed under the compaction in a way it
                cannot rebase over; nothing was written.
        """
        started = time.perf_counter()
        table = self._delta()
        last = None if table is None else self._token(table)
        if table is None or last is None or self._schema is None:
            return {"through_epoch": None, "folded_epochs": 0, "files_removed": 0,
                    "files_added": 0, "rows": 0, "seconds": 0.0}  # fmt: skip
        check_generation(table, self._fence, self.generation, table_name=self.uri)
        through = last - 1 if through_epoch is None else through_epoch
        if through > last:
            raise InvalidInputError(
                f"table {self.uri!r}: cannot compact through epoch {through}: the newest "
                f"epoch is {last}; nothing was written",
                table=self.uri,
                epoch=through,
            )
        files = live_files(table, name=self.uri)
        bases = [f for f in files if f.kind == "base"]
        folded = [f for f in files if f.kind == "change" and f.epoch <= through]
        report: dict[str, Any] = {"through_epoch": through, "folded_epochs": 0,
                                  "files_removed": 0, "files_added": 0}  # fmt: skip
        if folded:
            added = self._write_base(bases, folded, through, target_size)
            hooks.point(COMPACT_WRITTEN)
            self._commit_compaction(bases + folded, added, through)
            report.update(
                folded_epochs=len({f.epoch for f in folded}),
                files_removed=len(bases) + len(folded),
                files_added=len(added),
                rows=sum(f.num_records for f in added),
            )
        else:
            report["rows"] = None
        try:
            self.epochs.compact()
        except RetryableError as exc:
            log.info("epochs log of %s: compaction deferred: %s", self.uri, exc)
        report["seconds"] = round(time.perf_counter() - started, 3)
        return report

    def _write_base(
        self,
        bases: list[StoreFile],
        folded: list[StoreFile],
        through: int,
        target_size: int | None,
    ) -> list[DataFile]:
        """Merge the base and the folded change files; write the result as new base files."""
        assert self._schema is not None
        schema = stored_schema(self._schema, self.key_columns)
        columns = schema.names
        base = (
            read_data_files(self.uri, [f.path for f in bases], columns=columns)
            if bases
            else schema.empty_table()
        )
        changes = read_data_files(self.uri, [f.path for f in folded], columns=columns)
        state = pa.table(apply_changes(base, changes, self.key_columns).columns, schema=schema)
        per_row = max(1, state.nbytes // max(1, state.num_rows))
        per_file = max(1, (target_size or DEFAULT_TARGET_SIZE) // per_row)
        tag = uuid.uuid4().hex
        added = []
        for part, start in enumerate(range(0, max(state.num_rows, 1), per_file)):
            chunk = state.slice(start, per_file)
            if chunk.num_rows or part == 0:
                added.append(write_data_file(self.uri, base_file_name(through, tag, part), chunk))
        return added

    def _commit_compaction(
        self, replaced: list[StoreFile], added: list[DataFile], through: int
    ) -> None:
        """Commit the new base on a fresh snapshot, after checking it is still a valid fold."""
        assert self._schema is not None
        names = {f.path for f in added}

        def landed() -> bool:
            fresh = DeltaTable(self.uri)
            return names <= {f.path for f in live_files(fresh, name=self.uri)}

        for attempt in range(_COMMIT_ATTEMPTS):
            table = self._delta()
            assert table is not None
            check_generation(table, self._fence, self.generation, table_name=self.uri)
            live = {f.path: f for f in live_files(table, name=self.uri)}
            replaced_paths = {f.path for f in replaced}
            gone = [p for p in replaced_paths if p not in live]
            late = [
                f.path
                for f in live.values()
                if f.path not in replaced_paths and (f.kind == "base" or f.epoch <= through)
            ]
            if gone or late:
                # A revert or another compaction since our read: the fold we wrote no
                # longer describes the table. Its files are orphans for vacuum.
                raise RetryableError(
                    f"table {self.uri!r}: the table changed under compaction through epoch "
                    f"{through} (gone: {sorted(gone)}, new: {sorted(late)}); nothing was written",
                    table=self.uri,
                )
            try:
                commit_files(
                    self.uri,
                    added,
                    stored_schema(self._schema, self.key_columns),
                    app_id=self._fence,
                    version=self.generation,
                    remove=_as_removed(replaced),
                    fence=(self._fence, self.generation),
                    custom_metadata={
                        "reconcile.compacted_through": through,
                        "reconcile.generation": self.generation,
                    },
                    check_schema=False,  # written from the stored schema here
                    table_name=self.uri,
                    table=table,
                    landed=landed,
                    data_change=False,  # the same state, by merge-on-read, at every epoch
                )
                return
            except RetryableError:
                # An apply landed between our check and our commit (both carry the
                # fence token): check again on the newer snapshot and retry.
                if attempt == _COMMIT_ATTEMPTS - 1:
                    raise

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
