"""Reading a store table's changes: an epoch's own, the keys changed since an epoch."""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
import pyarrow.compute as pc  # type: ignore[import-untyped, unused-ignore]
from deltalake import DeltaTable

from expected_state.layout import EPOCH_COLUMN, OP_COLUMN, StoreFile
from expected_state.live import base_through, live_files
from expected_state.merge import last_per_key, member_mask
from expected_state.reading import Reading
from reconcile.core.contract import InvalidInputError

__all__ = ["ChangeReading"]


class ChangeReading(Reading):
    """Mixin for :class:`~expected_state.store.ExpectedStateStore`: reads that follow the
    changes since an epoch, so their cost follows the changes, not the table."""

    def _change_files_after(self, table: DeltaTable, since: int) -> list[StoreFile]:
        """The change files holding the epochs after ``since``, oldest epoch first.

        A merged file may also hold epochs up to ``since``: the caller filters rows.
        """
        files = live_files(table, name=self.uri)
        chosen = [f for f in files if f.kind == "change" and f.epoch > since]
        through = base_through(files)
        if through is not None and since < through:
            # Epochs (since, through] were folded into the base: their change files
            # are named by the commits that recorded them (vacuum keeps them from
            # its keep_from_epoch on). If vacuum pruned the log past `since`, some
            # of those commits are gone: say so rather than list only some keys.
            versions = self.epoch_versions()
            if self._history_from > 0 and since not in versions and since < min(versions):
                raise InvalidInputError(
                    f"table {self.uri!r}: the changes after epoch {since} are no longer all "
                    f"known: vacuum pruned the log below epoch {min(versions)} (pass "
                    "keep_from_epoch= to vacuum() to keep them)",
                    table=self.uri,
                    epoch=since,
                )
            base = table.table_uri.rstrip("/")
            chosen += [
                StoreFile(f"{base}/{path}", path, "change", e, 0)
                for e, paths in self._epoch_files.items()
                if since < e <= through
                for path in paths
            ]
        return sorted(chosen, key=lambda f: f.epoch)

    def changed_keys(self, since_epoch: int) -> pa.Table:
        """Keys whose expected state may have changed after ``since_epoch``.

        Reads only the change files of the epochs after ``since_epoch``: the cost
        follows the changes since then, not the table.

        Returns:
            The key columns plus ``_deleted`` (bool): for each key changed after
            ``since_epoch``, whether its newest change is a delete. A deleted key
            may not have existed at ``since_epoch`` (a delete of an absent key, or a
            key inserted and deleted again after it): telling that apart would mean
            reading the table; a diff finds it absent on both sides.
        """
        keys = self.key_columns
        table = self._delta()
        self.audit()  # before its files are listed: a foreign commit is named as such
        if table is None or self._schema is None:
            fields = [self._schema.field(k) if self._schema else pa.field(k, pa.string())
                      for k in keys]  # fmt: skip
            empty = pa.schema(fields).empty_table()
            return empty.append_column("_deleted", pa.array([], pa.bool_()))
        resolved = table.version()
        table = self._hold_newest(table)  # one a vacuum took first: the newest then
        if table.version() != resolved:
            self.audit()
        files = self._change_files_after(table, since_epoch)
        data = self._read(files, [*keys, EPOCH_COLUMN, OP_COLUMN], since_epoch)
        data = data.filter(pc.greater(data.column(EPOCH_COLUMN), since_epoch))
        newest = last_per_key(data, keys)
        deleted = pc.equal(newest.column(OP_COLUMN), "delete")
        return newest.select(keys).append_column("_deleted", deleted)

    def newest_changes(
        self, since_epoch: int, through_epoch: int, columns: Sequence[str]
    ) -> pa.Table:
        """The newest change of every key changed in epochs ``(since, through]``.

        Reads only the change files after ``since_epoch``, like ``changed_keys``:
        for a key changed in that window, its newest change there is its state
        at ``through_epoch`` (an upsert holds the row, a delete means no row),
        whatever the base holds. A key with a change after ``through_epoch``
        is left out (a merged change file may have hidden its state at
        ``through_epoch``): the caller reads it from a snapshot.

        Returns:
            The key columns, ``columns`` and ``_op``, one row per key.

        Raises:
            InvalidInputError: vacuum pruned the log or the files past ``since_epoch``.
        """
        keys = self.key_columns
        wanted = list(dict.fromkeys([*keys, *columns, OP_COLUMN]))
        table = self._delta()
        self.audit()  # before its files are listed: a foreign commit is named as such
        if table is None or self._schema is None:
            raise InvalidInputError(f"table {self.uri!r} holds no epoch", table=self.uri)
        files = self._change_files_after(table, since_epoch)
        read = list(dict.fromkeys([*wanted, EPOCH_COLUMN]))
        data = self._read(files, read, since_epoch)
        epochs = data.column(EPOCH_COLUMN)
        window = pc.and_(pc.greater(epochs, since_epoch), pc.less_equal(epochs, through_epoch))
        newest = last_per_key(data.filter(window), keys)
        # A merged change file keeps each key's newest row only: for a key with a
        # row after `through`, the row it hid may be the one that was newest at
        # `through`, and an older row of another file would win wrongly. Leave
        # such keys out (the caller reads them from a snapshot).
        later = data.filter(pc.greater(epochs, through_epoch)).select(keys)
        if later.num_rows:
            newest = newest.filter(pc.invert(member_mask(newest, later, keys)))
        return newest.select(wanted)

    def changes_of(self, epoch: int) -> pa.Table:
        """The changes recorded for ``epoch``: the user columns plus ``_op``.

        One row per key the epoch touched (its net change): ``_op`` "upsert" with
        the row, or "delete" with the key (value columns NULL). The form
        ``apply()`` takes, so it can be replayed into a sink that cannot be diffed.
        An epoch skipped over, or one without changes, has none.

        Raises:
            InvalidInputError: the epoch is not recorded, or vacuum removed its file.
        """
        table = self._delta()
        self.audit()  # before its files are listed: a foreign commit is named as such
        last = self.last_epoch()
        if table is None or self._schema is None or last is None or epoch > last:
            raise InvalidInputError(
                f"table {self.uri!r}: epoch {epoch} is not recorded (newest: {last})",
                table=self.uri,
                epoch=epoch,
            )
        columns = [*self._schema.names, OP_COLUMN]
        files = [
            f
            for f in live_files(table, name=self.uri)
            if f.kind == "change" and f.first == f.epoch == epoch  # its own file, not merged
        ]
        if not files:
            versions = self.epoch_versions()
            paths = self._epoch_files.get(epoch)
            if paths is not None:
                files = [StoreFile(path, path, "change", epoch, 0) for path in paths]
            elif not versions or epoch < min(versions):
                self.version_of(epoch)  # before the first epoch: raises
        return self._read(files, columns, epoch).select(columns)
