"""Rebasing a store table: a new expected state as of an epoch, in one fenced commit (a rebuild).

A rebuild recomputes a sink table's expected state with new logic.
``prepare_rebase`` finds what that changes: the new rows are converted and
hashed once, the old state is read as its keys and stored row hashes only,
and the two are joined by key. ``rebase`` commits the difference as ONE
Delta commit: the file holding the newest epoch (its change file, or the
merged file ending with it) is replaced by its rows with the difference on
top (upserts, and a tombstone per deleted key, stamped with that epoch). A
reader sees the old state or the new one, never a mix, and what is written
follows the difference, not the table: a row the new logic leaves alone is
not rewritten and keeps its ``_epoch``.

The commit carries the writer's fence token (a zombie's rebase fails, as its
epochs do) and the label the rebuild gives it (its id, and the logic version),
which is how a resumed rebuild finds a rebase it made before it was killed.
The state before is the version before the commit (time travel), which is
what a rollback reads. ``dataChange`` is true: unlike a compaction, the state
changes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
import pyarrow.compute as pc  # type: ignore[import-untyped, unused-ignore]
from deltalake import DeltaTable

from expected_state.changes import EpochChanges, change_rows, conform_upserts
from expected_state.delta_commit import BasedOn, DataFile, DeltaCommit, commit_files
from expected_state.delta_files import write_data_file
from expected_state.evolved_files import read_store_files
from expected_state.fencing import check_generation, rebuild_app_id
from expected_state.layout import (
    ROW_HASH_COLUMN,
    StoreFile,
    change_file_name,
    merged_file_name,
    stored_schema,
)
from expected_state.live import live_files
from expected_state.merge import apply_changes, last_per_key, member_mask
from reconcile.core import hooks
from reconcile.core.contract import InvalidInputError, RetryableError
from reconcile.core.hashing import row_hash_arrow
from reconcile.core.keys import all_distinct

__all__ = ["REBASE_WRITTEN", "REBUILD_LABEL", "Rebase", "Rebasing"]

# The rebase's file is written; the commit that makes it part of the table is next.
REBASE_WRITTEN = hooks.declare("expected_state.rebase.written")

REBUILD_LABEL = "reconcile.rebuild"  # commitInfo key: the rebuild (or rollback) that rebased
_COMMIT_ATTEMPTS = 3
_NEW_HASH, _OLD_HASH = "_new_hash", "_old_hash"


@dataclass(frozen=True)
class Rebase:
    """What a new state changes in a store table as of epoch ``through`` (nothing written yet).

    Attributes:
        through: the epoch the new state is as of.
        upserts: the new rows (user columns) of the keys inserted or changed.
        hashes: their row hashes, in order.
        deletes: the key columns of the keys the new state lacks.
        inserted: the key columns of the keys only the new state has.
        changed: the key columns of the keys both have, with other values.
    """

    through: int
    upserts: pa.Table
    hashes: pa.Array | pa.ChunkedArray
    deletes: pa.Table
    inserted: pa.Table
    changed: pa.Table

    @property
    def rows(self) -> int:
        """Every row the rebase writes: upserted or deleted."""
        return int(self.upserts.num_rows + self.deletes.num_rows)


class Rebasing:
    """Mixin for :class:`~expected_state.store.ExpectedStateStore`: ``rebase()``."""

    uri: str
    pipeline: str
    sink: str
    generation: int
    key_columns: list[str]
    column_types: Any
    _fence: str
    _schema: pa.Schema | None
    _delta: Callable[..., DeltaTable | None]
    _token: Callable[[DeltaTable], int | None]
    snapshot: Callable[..., pa.Table]  # provided by the store (Reading)
    _hold: Callable[[int], None]  # provided by the store (Holding)
    _hold_newest: Callable[[DeltaTable], DeltaTable]  # provided by the store (Holding)

    def check_files(self, files: list[StoreFile]) -> None:  # provided by the store
        raise NotImplementedError

    def state_at_version(self, version: int | None = None) -> pa.Table:
        """The state (stored columns, one row per key) of Delta ``version`` (None: now)."""
        table = DeltaTable(self.uri, version=version) if version is not None else self._delta()
        if table is None or self._schema is None:
            raise InvalidInputError(f"table {self.uri!r} holds no epoch", table=self.uri)
        # A rebuild reads it next: hold it from vacuum (the newest one: if a vacuum
        # took it before the hold counted, the newest then; a given one: refused).
        if version is None:
            table = self._hold_newest(table)
        else:
            self._hold(table.version())
        return self._state_of(live_files(table, name=self.uri))

    def _state_of(self, files: list[StoreFile]) -> pa.Table:
        assert self._schema is not None
        schema = stored_schema(self._schema, self.key_columns)
        self.check_files(files)  # a rebase of damaged files would record the damage

        def read(chosen: list[StoreFile]) -> pa.Table:
            if not chosen:
                return schema.empty_table()
            return read_store_files(self.uri, [f.path for f in chosen], columns=schema.names,
                                    stored=schema)  # fmt: skip

        base = read([f for f in files if f.kind == "base"])
        changes = read([f for f in files if f.kind == "change"])
        return pa.table(apply_changes(base, changes, self.key_columns).columns, schema=schema)

    def rebased_by(self, label: str) -> int | None:
        """The Delta version of the rebase commit labelled ``label``; None if there is none."""
        table = self._delta()
        if table is None:
            return None
        for commit in table.history():
            if commit.get(REBUILD_LABEL) == label:
                return int(commit["version"])
        return None

    def prepare_rebase(self, new: pa.Table, *, through: int) -> Rebase:
        """What making ``new`` the state as of epoch ``through`` changes; nothing is written.

        ``new``'s values are converted to the table's types as an epoch's are,
        and hashed once, with the store's row hash; the old state is read as its
        keys and stored row hashes only (no value is read or hashed again), and
        the two are joined by key.

        Raises:
            InvalidInputError: other columns than the table's, a repeated or NULL
                key, a value that does not fit, or no epoch recorded.
        """
        self._delta()
        user = self._schema
        if user is None:
            raise InvalidInputError(
                f"table {self.uri!r} holds no epoch: there is nothing to rebuild",
                table=self.uri,
            )
        if set(new.column_names) != set(user.names):
            raise InvalidInputError(
                f"table {self.uri!r}: a rebuild keeps the table's columns {user.names}; the "
                f"new logic gives {new.column_names} (add columns by schema evolution first); "
                "nothing was written",
                table=self.uri,
            )
        keys = self.key_columns
        upserts = conform_upserts(new.select(user.names), keys=keys, schema=user, table=self.uri,
                                  types=self.column_types)  # fmt: skip
        if len(keys) == 1 and not all_distinct(upserts.column(keys[0])):
            raise InvalidInputError(
                f"table {self.uri!r}: the new state holds a key more than once; a rebuild "
                "needs one row per key; nothing was written",
                table=self.uri,
            )
        if len(keys) > 1:
            distinct = upserts.select(keys).group_by(keys).aggregate([]).num_rows
            if distinct != upserts.num_rows:
                raise InvalidInputError(
                    f"table {self.uri!r}: the new state holds {upserts.num_rows - distinct} "
                    "repeated keys; a rebuild needs one row per key; nothing was written",
                    table=self.uri,
                )
        hashes = row_hash_arrow(upserts, user.names)
        old = self.snapshot(through, [*keys, ROW_HASH_COLUMN])
        wanted, deleted, inserted, changed = _compare(upserts.select(keys), hashes, old, keys)
        return Rebase(through, upserts.filter(wanted), pc.filter(hashes, wanted), deleted,
                      inserted, changed)  # fmt: skip

    def rebase(
        self, rebase: Rebase, *, label: str, metadata: Mapping[str, Any], started: int | None = None
    ) -> int:
        """Commit ``rebase`` in ONE fenced Delta commit; its Delta version.

        ``started``: the number of its rebuild's "started" step in the rebuild
        log, recorded in the commit (app transaction ``rebuild_app_id``), so
        that a store rebased by a rebuild the log no longer holds is refused
        (``expected_state.rebuild_audit``).

        The difference goes into the file that holds epoch ``through``: that
        epoch's change file (or the merged file that ends with it) is replaced
        by one holding its rows with the difference on top, the newest change
        of each key winning; with none, a new change file of that epoch holds
        the difference alone. No other file is read or written, so the cost
        follows the difference and that one file, not the table.

        Raises:
            InvalidInputError: an epoch after ``through`` is recorded; nothing was
                written.
            FencedError: a newer generation has taken over; nothing was written.
            RetryableError: the table changed under the rebase; nothing was written.
        """
        user = self._schema
        assert user is not None, "prepare_rebase() read the table's schema"
        keys, through = self.key_columns, rebase.through
        stored = stored_schema(user, keys)
        diff = change_rows(EpochChanges(rebase.upserts, rebase.deletes), user, stored, keys,
                           through, row_hashes=rebase.hashes)  # fmt: skip
        for attempt in range(_COMMIT_ATTEMPTS):
            table = self._delta()
            assert table is not None
            check_generation(table, self._fence, self.generation, table_name=self.uri)
            last = self._token(table)
            if last is not None and last > through:
                raise InvalidInputError(
                    f"table {self.uri!r}: epoch {last} is recorded, after epoch {through} the "
                    "rebuild is as of; nothing was written",
                    table=self.uri,
                    epoch=last,
                )
            # The ranges of live change files never overlap: one file at most ends here.
            holder = [f for f in live_files(table, name=self.uri)
                      if f.kind == "change" and f.epoch == through]  # fmt: skip
            added = (
                self._write_over(holder, diff, stored, through) if diff.num_rows or holder else []
            )
            hooks.point(REBASE_WRITTEN)
            try:
                commit = DeltaCommit(
                    table_uri=self.uri,
                    schema=stored,
                    app_id=self._fence,
                    version=self.generation,
                    add=added,
                    remove=[DataFile(f.path, f.size, 0, "", 0) for f in holder],
                    fence=(self._fence, self.generation),
                    custom_metadata={
                        **metadata,
                        REBUILD_LABEL: label,
                        "reconcile.generation": self.generation,
                    },
                    tokens=(
                        [(rebuild_app_id(self.pipeline, self.sink), started)]
                        if started is not None
                        else []
                    ),
                    check_schema=False,  # written from the stored schema here
                )
                done = commit_files(commit, BasedOn(table, landed=self._landed(label)))
                found = done.table_version
                if found is None:
                    found = self.rebased_by(label)
                if found is None:  # pragma: no cover - commit_files raises rather
                    raise RetryableError(f"table {self.uri!r}: the rebase did not land")
                return found
            except RetryableError:
                # A commit of the same writer (a compaction) landed between the read and
                # the commit: the file we replace may be gone; again, on a fresh snapshot.
                if attempt == _COMMIT_ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _landed(self, label: str) -> Callable[[], bool]:
        def landed() -> bool:
            return self.rebased_by(label) is not None

        return landed

    def _write_over(
        self, holder: list[StoreFile], diff: pa.Table, stored: pa.Schema, through: int
    ) -> list[DataFile]:
        """The file of the rebase: ``holder``'s rows (if any) with ``diff`` on top."""
        if not holder:
            return [write_data_file(self.uri, change_file_name(through), diff)]
        [file] = holder
        self.check_files([file])  # a rebase over a damaged file would record the damage
        rows = read_store_files(self.uri, [file.path], columns=stored.names, stored=stored)
        merged = last_per_key(pa.concat_tables([rows, diff.select(stored.names)]), self.key_columns)
        name = merged_file_name(file.first, through) if file.merged else change_file_name(through)
        return [write_data_file(self.uri, name, pa.table(merged.columns, schema=stored))]


def _compare(
    new: pa.Table, hashes: pa.Array, old: pa.Table, keys: list[str]
) -> tuple[pa.Array, pa.Table, pa.Table, pa.Table]:
    """New keys and hashes against the old state's: (new rows to write, deleted, inserted, changed).

    One integer key (the usual case) is compared with numpy's sorted search,
    which took a fifth of the time of Arrow's hash join on ten million keys
    here; any other key by that join.
    """
    key = keys[0]
    if old.num_rows == 0:  # every key is new
        return pa.array(np.ones(new.num_rows, dtype=bool)), old.select(keys), new, new.slice(0, 0)
    if len(keys) == 1 and pa.types.is_integer(new.schema.field(key).type):
        new_keys = np.asarray(new.column(key).to_numpy())
        old_keys = np.asarray(old.column(key).to_numpy())
        old_hashes = np.asarray(old.column(ROW_HASH_COLUMN).to_numpy())
        if np.array_equal(new_keys, old_keys):
            # The same keys in the same order (a fix that changes values only, and
            # the store's rows in the order they were written): compare in place.
            same = old_hashes == np.asarray(hashes.to_numpy())
            return (
                pa.array(~same),
                old.select(keys).slice(0, 0),
                new.slice(0, 0),
                new.filter(pa.array(~same)),
            )
        order = np.argsort(old_keys, kind="stable")
        sorted_keys = old_keys[order]
        at = np.minimum(np.searchsorted(sorted_keys, new_keys), len(sorted_keys) - 1)
        found = sorted_keys[at] == new_keys
        same = found & (old_hashes[order][at] == np.asarray(hashes.to_numpy()))
        wanted = ~same
        kept = np.zeros(len(old_keys), dtype=bool)
        kept[order[at[found]]] = True
        return (
            pa.array(wanted),
            old.filter(pa.array(~kept)).select(keys),
            new.filter(pa.array(~found)),
            new.filter(pa.array(found & ~same)),
        )
    probe = new.append_column(_NEW_HASH, hashes)
    joined = probe.join(old.rename_columns([*keys, _OLD_HASH]), keys, join_type="full outer",
                        coalesce_keys=True)  # fmt: skip
    has_new, has_old = pc.is_valid(joined.column(_NEW_HASH)), pc.is_valid(joined.column(_OLD_HASH))
    inserted = joined.filter(pc.invert(has_old)).select(keys)
    changed = joined.filter(pc.and_(pc.and_(has_new, has_old), pc.not_equal(
        joined.column(_NEW_HASH), joined.column(_OLD_HASH)))).select(keys)  # fmt: skip
    deleted = joined.filter(pc.invert(has_new)).select(keys)
    wanted = member_mask(new, pa.concat_tables([inserted, changed]), keys)
    return wanted, deleted, inserted, changed
