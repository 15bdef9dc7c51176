"""Reading a store table: snapshots by merge-on-read, an epoch's changes, keys changed since."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError, TableNotFoundError

from expected_state.delta_files import data_file_rows
from expected_state.evolved_files import read_store_files, read_store_files_where
from expected_state.layout import (
    EPOCH_COLUMN,
    OP_COLUMN,
    StoreFile,
    state_schema,
    stored_schema,
)
from expected_state.live import fold_point, live_files
from expected_state.merge import apply_changes
from expected_state.parts_reading import read_in_parts
from expected_state.ranges import row_filter
from reconcile.core.contract import InvalidInputError

__all__ = ["Reading", "live_files"]


class Reading:
    """Mixin for :class:`~expected_state.store.ExpectedStateStore`: everything that reads."""

    uri: str
    app_id: str
    key_columns: list[str]
    _schema: pa.Schema | None
    _versions: dict[int, int]
    _epoch_files: dict[int, list[str]]  # epoch -> its change files (usually one)
    _versions_upto: int
    _history_from: int  # the oldest version history() still returned

    def _delta(self, *, refresh: bool = True) -> DeltaTable | None:  # provided by the store
        raise NotImplementedError

    def last_epoch(self) -> int | None:  # provided by the store
        raise NotImplementedError

    def _hold(self, version: int) -> None:  # provided by the store (Holding)
        raise NotImplementedError

    def _hold_newest(self, table: DeltaTable) -> DeltaTable:  # provided by the store (Holding)
        raise NotImplementedError

    # -- epochs and versions ---------------------------------------------------

    def epoch_versions(self) -> dict[int, int]:
        """Epoch -> Delta version of every recorded epoch, oldest first.

        Read from the commitInfo that each apply() and revert() commit carries
        (the same atomic commit as the data and the token), incrementally: only
        commits newer than the last call are read. A reverted epoch is dropped;
        if it is applied again, its new commit is the one listed.
        """
        table = self._delta()
        if table is None:
            return {}
        current = table.version()
        if current > self._versions_upto:
            # history() lists the newest commit first; replay oldest first, so that a
            # revert drops the epoch and a later apply of it records it again.
            history = table.history(limit=current - self._versions_upto)
            if self._versions_upto < 0 and history:
                self._history_from = min(int(c["version"]) for c in history)
            for commit in reversed(history):
                if commit.get("reconcile.app_id") != self.app_id:
                    continue
                epoch = commit.get("reconcile.epoch")
                reverted = commit.get("reconcile.reverted")
                if epoch is not None:
                    self._versions[int(epoch)] = int(commit["version"])
                    path = commit.get("reconcile.file")
                    if path:
                        self._epoch_files[int(epoch)] = str(path).split(",")
                    else:
                        self._epoch_files.pop(int(epoch), None)
                elif reverted is not None:
                    self._versions.pop(int(reverted), None)
                    self._epoch_files.pop(int(reverted), None)
            self._versions_upto = current
        return dict(sorted(self._versions.items()))

    def version_of(self, epoch: int) -> int:
        """The Delta version holding the state as of ``epoch``.

        An epoch skipped with ``allow_gap`` had no output, so its state is the
        newest recorded epoch before it.

        Raises:
            InvalidInputError: the epoch is before the first or after the last recorded one.
        """
        versions = self.epoch_versions()
        recorded = [e for e in versions if e <= epoch]
        last = self.last_epoch()
        if not recorded and self._history_from > 0 and last is not None and epoch <= last:
            raise InvalidInputError(
                f"table {self.uri!r}: the files of epoch {epoch} are gone (vacuumed?): the "
                f"log was pruned below epoch {min(versions, default=last)}",
                table=self.uri,
                epoch=epoch,
            )
        if not recorded or last is None or epoch > last:
            raise InvalidInputError(
                f"table {self.uri!r}: epoch {epoch} is not recorded (recorded: "
                f"{min(versions) if versions else None}..{last})",
                table=self.uri,
                epoch=epoch,
            )
        return versions[max(recorded)]

    def _at_version(self, epoch: int) -> DeltaTable:
        """The table as of the version that recorded ``epoch`` (time travel).

        Raises:
            InvalidInputError: the epoch is not recorded, or vacuum pruned its version.
        """
        version = self.version_of(epoch)
        self._hold(version)  # before its files are listed and read
        try:
            return DeltaTable(self.uri, version=version)
        except (TableNotFoundError, DeltaError, OSError) as exc:
            raise InvalidInputError(
                f"table {self.uri!r}: the files of epoch {epoch} are gone (vacuumed?): "
                f"version {version} is no longer in the log ({exc})",
                table=self.uri,
                epoch=epoch,
            ) from exc

    def audit(self, version: int | None = None) -> None:  # provided by the store
        raise NotImplementedError

    def check_files(self, files: Sequence[StoreFile]) -> None:  # provided by the store
        raise NotImplementedError

    # -- snapshots ---------------------------------------------------------------

    def _empty_state(self) -> pa.Table:
        if self._schema is None:
            return pa.table({})
        return state_schema(self._schema).empty_table()

    def _read(self, files: Sequence[StoreFile], columns: Sequence[str], epoch: int | None,
              keep: Callable[[pa.Table], pa.Array] | None = None) -> Any:  # fmt: skip
        assert self._schema is not None
        stored = stored_schema(self._schema, self.key_columns)
        empty = pa.schema([stored.field(c) for c in columns])
        if not files:
            return empty.empty_table()
        self.check_files(files)
        paths = [f.path for f in files]
        try:
            if keep is not None:  # filtered batch by batch: memory follows the rows kept
                return read_store_files_where(self.uri, paths, columns=columns, keep=keep,
                                              empty=empty, stored=stored)  # fmt: skip
            return read_store_files(self.uri, paths, columns=columns, stored=stored)
        except (OSError, FileNotFoundError) as exc:
            raise InvalidInputError(
                f"table {self.uri!r}: the files of epoch {epoch} are gone (vacuumed?): {exc}",
                table=self.uri,
                epoch=epoch,
            ) from exc

    def files_at(self, epoch: int | None) -> list[StoreFile] | None:
        """The data files a snapshot as of ``epoch`` reads (None: the table holds no epoch).

        An epoch at or after the base's fold point is read from the current
        version; an older one from the Delta version that recorded it.

        Raises:
            InvalidInputError: the epoch is not recorded.
        """
        table = self._delta()
        self.audit()  # before its files are listed: a foreign commit is named as such
        if table is None or self._schema is None:
            return None
        # Every snapshot reader comes through here: within holding(), the version
        # it reads is kept from vacuum while it reads (a merge may make it old);
        # one a vacuum took before the hold counted is read newer, audited again.
        resolved = table.version()
        table = self._hold_newest(table)
        if table.version() != resolved:
            self.audit()
        files = live_files(table, name=self.uri)
        if epoch is not None:
            last = self.last_epoch()
            through = fold_point(files)
            if last is None or epoch > last:
                self.version_of(epoch)  # raises, naming the recorded range
            if through is not None and epoch < through:
                # Folded or merged since: read the version that recorded it, where
                # every epoch after the fold point up to it still has its own file.
                older = self._at_version(epoch)
                self.audit(older.version())
                files = live_files(older, name=self.uri)
            elif through is None and not any(f.epoch <= epoch for f in files):
                self.version_of(epoch)  # before the first epoch? (raises if so)
            files = [f for f in files if f.kind == "base" or f.epoch <= epoch]
        return files

    def stored_rows(self, epoch: int | None = None) -> int:
        """The rows of the files a snapshot as of ``epoch`` reads, as the log records them.

        At least the snapshot's rows (a key changed in several epochs is counted
        in each): what a bounded-memory reader sizes its parts by. No file is
        opened but one whose log entry lacks its row count (its footer then);
        the reads that follow check every footer against its entry.
        """
        files = self.files_at(epoch) or []
        unrecorded = [f.path for f in files if f.rows is None]
        recorded = sum(f.rows for f in files if f.rows is not None)
        return recorded + (data_file_rows(self.uri, unrecorded) if unrecorded else 0)

    def snapshot_parts(self, epoch: int | None, columns: Sequence[str], *, parts: int,
                       where: str | None = None) -> Iterator[tuple[int, pa.Table]]:  # fmt: skip
        """The snapshot as of ``epoch``, split by key into ``parts``, one part at a time.

        What ``snapshot`` returns, in pieces: part ``i`` holds the keys whose
        hash falls in it (``reconcile.core.spill.parts_of``), so that a reader
        holds one part in memory, never the table. The files are streamed once
        and spilled under ``where`` (default the system's temporary folder).

        Raises:
            InvalidInputError: the epoch is not recorded, or vacuum removed its files.
        """
        files = self.files_at(epoch)
        if files is None or self._schema is None:
            for part in range(parts):
                yield part, self._empty_state().select(list(columns))
            return
        self.check_files(files)
        stored = stored_schema(self._schema, self.key_columns)
        yield from read_in_parts(self.uri, files, stored, self.key_columns, list(columns),
                                 parts=parts, where=where, epoch=epoch)  # fmt: skip

    def snapshot(
        self,
        epoch: int | None = None,
        columns: Sequence[str] | None = None,
        *,
        keys: pa.Table | None = None,
        ranges: Sequence[tuple[Any, Any]] | None = None,
    ) -> pa.Table:
        """The expected state as of ``epoch`` (default: the newest), as Arrow.

        Merge-on-read: the base plus the change files up to ``epoch``, the newest
        change of each key winning and a delete leaving no row. An epoch at or
        after the base's fold point is read from the current version; an older
        one from the Delta version that recorded it (time travel).

        Args:
            epoch: a recorded epoch (or one skipped over), or None for the newest.
            columns: the columns to read (default all: keys, values, _row_hash, _epoch).
            keys: only the rows of these keys (a table with the key columns): the
                files are still read, but the merge, which costs most, runs over
                those keys only (what scoped recovery reads).
            ranges: only the rows whose FIRST key column is in one of these
                ``[lo, hi)`` ranges (None: unbounded on that side); what buckets
                mode reads for the ranges that differ. A key's rows all share
                its first-key value, so filtering before the merge is exact.

        Returns:
            One row per key.

        Raises:
            InvalidInputError: the epoch is not recorded, or vacuum removed its files.
        """
        files = self.files_at(epoch)
        if files is None or self._schema is None:
            return self._empty_state()
        wanted = list(columns) if columns else state_schema(self._schema).names
        read = list(dict.fromkeys([*self.key_columns, *wanted, EPOCH_COLUMN, OP_COLUMN]))
        some = keys is not None or ranges is not None
        keep = row_filter(self.key_columns, keys, ranges) if some else None
        base = self._read([f for f in files if f.kind == "base"], read, epoch, keep)
        changes = self._read([f for f in files if f.kind == "change"], read, epoch, keep)
        state = apply_changes(base, changes, self.key_columns)
        return state.select(wanted)
