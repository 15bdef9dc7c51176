"""Off the write path: merge change files (compact_changes) and fold them into the base (compact).

Both compute their result on one snapshot (the long part), then commit it on a
fresh snapshot after checking there that the result still describes the table:
every file they replace is still live, and no change of an epoch they cover
appeared since (a revert and a re-run, another compaction). An ``apply()``
that landed meanwhile only added a later epoch's file, which stays. Both
commits carry the writer's fence token and ``dataChange=false``: every epoch's
state is the same before and after, by the merge rule.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import TYPE_CHECKING, Any

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
from deltalake import DeltaTable

from expected_state.delta_commit import (
    BasedOn,
    DataFile,
    DeltaCommit,
    commit_files,
    write_data_file,
)
from expected_state.evolved_files import read_store_files
from expected_state.fencing import check_generation
from expected_state.layout import StoreFile, base_file_name, merged_file_name, stored_schema
from expected_state.live import live_files
from expected_state.memory import release_freed_memory
from expected_state.merge import apply_changes, last_per_key
from reconcile.core import hooks
from reconcile.core.contract import InvalidInputError, RetryableError

if TYPE_CHECKING:
    from expected_state.epochs import EpochLog

__all__ = ["COMPACT_WRITTEN", "DEFAULT_MERGE_MAX_ROWS", "DEFAULT_TARGET_SIZE", "Compaction",
           "merge_groups"]  # fmt: skip

log = logging.getLogger(__name__)

# A compaction has written its new files (the long part) and is about to base
# its commit on a fresh snapshot: applies, reverts and takeovers land here.
COMPACT_WRITTEN = hooks.declare("expected_state.compact.written")

DEFAULT_TARGET_SIZE = 128 * 1024 * 1024  # bytes of Arrow data per base file
# The most rows one merge of change files reads (its memory); a change file of half
# as many or more is large: it is never merged again.
DEFAULT_MERGE_MAX_ROWS = 1_000_000
_COMMIT_ATTEMPTS = 4
# Files of one segment that its runs may leave as they are (each run becomes one
# file): past it the segment is packed by rows alone (``_tiered_runs``).
_MOST_FILES_LEFT = 64


def merge_groups(changes: list[StoreFile], max_rows: int) -> list[list[StoreFile]]:
    """The runs of change files one merge each takes: consecutive, small, of like sizes.

    Merging every change file each time would read the whole table again once
    per merge where epochs mostly insert (the changes are the table): the cost
    and the memory would grow with the table. So a change file of at least
    ``max_rows // 2`` rows (or of no recorded count) is large and left as it
    is. The small ones between two large ones form a *segment*, cut into runs
    by ``_tiered_runs``: a file joins the newer files after it only once those
    hold at least as many rows as it does, so a merged file is rewritten only
    when what joins it about doubles it (a row is merged about log2(max_rows /
    rows a merge adds) times before its file is large, not once per merge).
    Only runs of consecutive files are merged: a merged file covers the epochs
    first..last, and the ranges of live change files never overlap
    (merge-on-read orders files by epoch).

    Returns:
        Runs of two files or more, oldest first.
    """
    segments: list[list[StoreFile]] = [[]]
    for f in sorted(changes, key=lambda f: f.epoch):
        if f.rows is None or f.rows >= max_rows // 2:
            segments.append([])  # large: it stays, and no run spans it
            continue
        segments[-1].append(f)
    return [run for segment in segments for run in _tiered_runs(segment, max_rows)
            if len(run) > 1]  # fmt: skip


def _tiered_runs(segment: list[StoreFile], max_rows: int) -> list[list[StoreFile]]:
    """A segment of small files (oldest first) cut into runs, oldest first.

    From the newest file back: an older file joins the run while the run holds
    at least as many rows as it (and stays within ``max_rows``). Epochs of like
    sizes merge at once; an older, bigger merged file waits until newer ones
    add up to it. Where epochs shrink steadily (each older file bigger than all
    the newer ones together) no run would form and the files would pile up
    without bound: past ``_MOST_FILES_LEFT`` files left alone, the segment is
    packed oldest first into runs of at most ``max_rows`` rows instead.
    """
    runs: list[list[StoreFile]] = []
    end = len(segment)
    while end > 0:
        start, total = end - 1, segment[end - 1].rows or 0
        while start > 0:
            older = segment[start - 1].rows or 0
            if older > total or total + older > max_rows:
                break
            start, total = start - 1, total + older
        runs.insert(0, segment[start:end])
        end = start
    if len(runs) <= _MOST_FILES_LEFT:
        return runs
    packed: list[list[StoreFile]] = [[]]
    total = 0
    for f in segment:
        if total + (f.rows or 0) > max_rows:
            packed.append([])
            total = 0
        packed[-1].append(f)
        total += f.rows or 0
    return packed


class Compaction:
    """Mixin for :class:`~expected_state.store.ExpectedStateStore`: the two compactions."""

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

    def check_files(self, files: list[StoreFile]) -> None:  # provided by the store
        raise NotImplementedError

    def _plan(self, through_epoch: int | None) -> tuple[list[StoreFile], int] | None:
        """The live files and the epoch to compact through; None if nothing is recorded.

        Raises:
            FencedError: a newer generation has taken over.
            InvalidInputError: ``through_epoch`` is after the newest epoch.
        """
        table = self._delta()
        last = None if table is None else self._token(table)
        if table is None or last is None or self._schema is None:
            return None
        check_generation(table, self._fence, self.generation, table_name=self.uri)
        # The newest epoch may not be decided yet: by default it keeps a file of
        # its own, so that revert() can still take it out.
        through = last - 1 if through_epoch is None else through_epoch
        if through > last:
            raise InvalidInputError(
                f"table {self.uri!r}: cannot compact through epoch {through}: the newest "
                f"epoch is {last}; nothing was written",
                table=self.uri,
                epoch=through,
            )
        return live_files(table, name=self.uri), through

    def compact_changes(
        self, *, through_epoch: int | None = None, max_rows: int = DEFAULT_MERGE_MAX_ROWS
    ) -> dict[str, Any]:
        """Merge the small change files of epochs up to ``through_epoch``, a run at a time.

        Each run of consecutive small change files (``merge_groups``) becomes
        one change file holding the newest change of each key over its epochs,
        tombstones included, so reading the table touches fewer files while the
        base and the large change files are left alone: the cost and the memory
        follow ``max_rows``, not the table. All the runs are committed at once.
        States as of the merged epochs are then read by time travel.

        Args:
            through_epoch: merge epochs up to this one. Default: all but the newest.
            max_rows: the most rows one run holds (one run is read at a time).

        Returns:
            ``through_epoch``, ``merged_files``, ``runs``, ``rows`` (of the merged
            files written) and ``seconds``.

        Raises:
            FencedError: a newer generation has taken over; nothing was written.
            InvalidInputError: ``through_epoch`` is after the newest epoch.
            RetryableError: the table changed under it; nothing was written.
        """
        if max_rows < 2:
            raise InvalidInputError(
                f"table {self.uri!r}: max_rows must be at least 2, got {max_rows}; "
                "nothing was written",
                table=self.uri,
            )
        started = time.perf_counter()
        plan = self._plan(through_epoch)
        report: dict[str, Any] = {"through_epoch": None, "merged_files": 0, "runs": 0, "rows": 0}
        if plan is not None:
            files, through = plan
            changes = [f for f in files if f.kind == "change" and f.epoch <= through]
            report["through_epoch"] = through
            runs = merge_groups(changes, max_rows)
            if runs:
                assert self._schema is not None
                schema = stored_schema(self._schema, self.key_columns)
                added = []
                for run in runs:
                    # A merge of a damaged file would record the damage as the truth:
                    # the files are checked against their log entries first.
                    self.check_files(run)
                    rows = read_store_files(self.uri, [f.path for f in run], columns=schema.names,
                                            stored=schema)  # fmt: skip
                    newest = pa.table(last_per_key(rows, self.key_columns).columns, schema=schema)
                    name = merged_file_name(run[0].first, run[-1].epoch)
                    added.append(write_data_file(self.uri, name, newest))
                    del rows, newest  # one run in memory at a time
                    # The allocators keep what a run freed; its size follows the run, so
                    # RSS would stay at the biggest run's peak between merges.
                    release_freed_memory()
                hooks.point(COMPACT_WRITTEN)
                merged = [f for run in runs for f in run]
                self._commit_compaction(merged, added, through, folds_base=False,
                                        kept={f.path for f in files})  # fmt: skip
                report.update(merged_files=len(merged), runs=len(runs),
                              rows=sum(f.num_records for f in added))  # fmt: skip
        report["seconds"] = round(time.perf_counter() - started, 3)
        return report

    def compact(
        self, target_size: int | None = None, *, through_epoch: int | None = None
    ) -> dict[str, Any]:
        """Fold the change files of epochs up to ``through_epoch`` into a new base.

        Never called by ``apply()``: the write path only appends. The old base and
        the folded changes are merged by the rule (tombstones dropped) and written
        as base files; the table's own epochs log is compacted too.

        Args:
            target_size: about how many bytes of Arrow data per base file.
            through_epoch: fold epochs up to this one. Default: all but the newest,
                which stays revertible (``revert()`` of a folded epoch is refused).

        Returns:
            ``through_epoch``, ``folded_epochs`` (change files folded),
            ``files_removed``, ``files_added``, ``rows`` (of the new base), ``seconds``.

        Raises:
            FencedError: a newer generation has taken over; nothing was written.
            InvalidInputError: ``through_epoch`` is after the newest epoch.
            RetryableError: the table changed under the compaction in a way it
                cannot rebase over; nothing was written.
        """
        started = time.perf_counter()
        plan = self._plan(through_epoch)
        report: dict[str, Any] = {"through_epoch": None, "folded_epochs": 0, "files_removed": 0,
                                  "files_added": 0, "rows": None}  # fmt: skip
        if plan is not None:
            files, through = plan
            bases = [f for f in files if f.kind == "base"]
            folded = [f for f in files if f.kind == "change" and f.epoch <= through]
            report["through_epoch"] = through
            if folded:
                added = self._write_base(bases, folded, target_size)
                release_freed_memory()  # as after a merge's run
                hooks.point(COMPACT_WRITTEN)
                self._commit_compaction(bases + folded, added, through, folds_base=True)
                report.update(
                    folded_epochs=sum(f.epoch - f.first + 1 for f in folded),
                    files_removed=len(bases) + len(folded),
                    files_added=len(added),
                    rows=sum(f.num_records for f in added),
                )
            try:
                self.epochs.compact()
            except RetryableError as exc:
                log.info("epochs log of %s: compaction deferred: %s", self.uri, exc)
        report["seconds"] = round(time.perf_counter() - started, 3)
        return report

    def _write_base(
        self, bases: list[StoreFile], folded: list[StoreFile], target_size: int | None
    ) -> list[DataFile]:
        """Merge the base and the folded change files; write the result as new base files."""
        assert self._schema is not None
        schema = stored_schema(self._schema, self.key_columns)
        columns = schema.names
        # A fold of a damaged file would record the damage as the truth.
        self.check_files([*bases, *folded])
        base = (
            read_store_files(self.uri, [f.path for f in bases], columns=columns, stored=schema)
            if bases
            else schema.empty_table()
        )
        changes = read_store_files(self.uri, [f.path for f in folded], columns=columns,
                                   stored=schema)  # fmt: skip
        state = pa.table(apply_changes(base, changes, self.key_columns).columns, schema=schema)
        per_row = max(1, state.nbytes // max(1, state.num_rows))
        per_file = max(1, (target_size or DEFAULT_TARGET_SIZE) // per_row)
        # The base is named by the newest epoch it really holds: a merged file that
        # reaches past the requested epoch is not folded (the ranges are disjoint).
        through = max(f.epoch for f in folded)
        tag = uuid.uuid4().hex
        added = []
        for part, start in enumerate(range(0, max(state.num_rows, 1), per_file)):
            chunk = state.slice(start, per_file)
            if chunk.num_rows or part == 0:
                added.append(write_data_file(self.uri, base_file_name(through, tag, part), chunk))
        return added

    def _commit_compaction(
        self,
        replaced: list[StoreFile],
        added: list[DataFile],
        through: int,
        *,
        folds_base: bool,
        kept: set[str] | None = None,
    ) -> None:
        """Commit ``added`` in place of ``replaced`` on a fresh snapshot, if still valid.

        Valid means: every replaced file is still live, and no other file holds
        changes of an epoch up to ``through`` (nor, for a fold, another base),
        but the files of ``kept``: those live when the merge was planned, which
        it left as they were (large ones, or runs of one).
        """
        assert self._schema is not None
        names = {f.path for f in added}
        marker = "reconcile.compacted_through" if folds_base else "reconcile.merged_through"

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
                if f.path not in replaced_paths
                and f.path not in (kept or ())
                and (
                    (f.kind == "change" and f.epoch <= through) or (folds_base and f.kind == "base")
                )
            ]
            if gone or late:
                # A revert or another compaction since our read: what we wrote no
                # longer describes the table. Its files are orphans for vacuum.
                raise RetryableError(
                    f"table {self.uri!r}: the table changed under compaction through epoch "
                    f"{through} (gone: {sorted(gone)}, new: {sorted(late)}); nothing was written",
                    table=self.uri,
                )
            try:
                compaction = DeltaCommit(
                    table_uri=self.uri,
                    schema=stored_schema(self._schema, self.key_columns),
                    app_id=self._fence,
                    version=self.generation,
                    add=added,
                    remove=[DataFile(f.path, f.size, 0, "", 0) for f in replaced],
                    fence=(self._fence, self.generation),
                    custom_metadata={marker: through, "reconcile.generation": self.generation},
                    data_change=False,  # the same state, by merge-on-read, at every epoch
                    check_schema=False,  # written from the stored schema here
                )
                commit_files(compaction, BasedOn(table, landed=landed))
                return
            except RetryableError:
                # An apply landed between our check and our commit (both carry the
                # fence token): check again on the newer snapshot and retry.
                if attempt == _COMMIT_ATTEMPTS - 1:
                    raise
