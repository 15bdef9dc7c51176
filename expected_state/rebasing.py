"""Rebasing a store table: a new expected state as of an epoch, in one fenced commit (a rebuild).

A rebuild recomputes a sink table's expected state with new logic. The store
takes it as ONE Delta commit that replaces every live file with new base
files holding the new state as of the newest epoch: a reader sees the old
state or the new one, never a mix. The commit carries the writer's fence
token (a zombie's rebase fails, as its epochs do) and the labels the rebuild
gives it (its id and the logic version), which is how a resumed rebuild finds
a rebase it made before it was killed. The state before is still the
version before the commit (time travel), which is what a rollback reads.

A row keeps the ``_epoch`` it had when the new logic gives it the same values
(same row hash); a row the rebuild inserts or changes carries the epoch the
state is as of. ``dataChange`` is true: unlike a compaction, the state changes.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
import pyarrow.compute as pc  # type: ignore[import-untyped, unused-ignore]
from deltalake import DeltaTable

from expected_state.changes import normalize_changes
from expected_state.compaction import DEFAULT_TARGET_SIZE
from expected_state.delta_commit import BasedOn, DataFile, DeltaCommit, commit_files
from expected_state.delta_files import write_data_file
from expected_state.evolved_files import read_store_files
from expected_state.fencing import check_generation
from expected_state.layout import (
    EPOCH_COLUMN,
    OP_COLUMN,
    ROW_HASH_COLUMN,
    StoreFile,
    base_file_name,
    stored_schema,
)
from expected_state.live import live_files
from expected_state.merge import apply_changes
from reconcile.core import hooks
from reconcile.core.contract import InvalidInputError, RetryableError
from reconcile.core.hashing import row_hash_arrow

__all__ = ["REBASE_WRITTEN", "REBUILD_LABEL", "Rebasing"]

# The new base files are written; the commit that makes them the table is next.
REBASE_WRITTEN = hooks.declare("expected_state.rebase.written")

REBUILD_LABEL = "reconcile.rebuild"  # commitInfo key: the rebuild (or rollback) that rebased
_COMMIT_ATTEMPTS = 3


class Rebasing:
    """Mixin for :class:`~expected_state.store.ExpectedStateStore`: ``rebase()``."""

    uri: str
    generation: int
    key_columns: list[str]
    column_types: Any
    _fence: str
    _schema: pa.Schema | None
    _delta: Callable[..., DeltaTable | None]
    _token: Callable[[DeltaTable], int | None]

    def check_files(self, files: list[StoreFile]) -> None:  # provided by the store
        raise NotImplementedError

    def state_at_version(self, version: int | None = None) -> pa.Table:
        """The state (stored columns, one row per key) of Delta ``version`` (None: now)."""
        table = DeltaTable(self.uri, version=version) if version is not None else self._delta()
        if table is None or self._schema is None:
            raise InvalidInputError(f"table {self.uri!r} holds no epoch", table=self.uri)
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

    def rebase(
        self, new: pa.Table, *, through: int, label: str, metadata: Mapping[str, Any]
    ) -> int:
        """Make ``new`` the table's state as of epoch ``through``, in ONE fenced commit.

        Args:
            new: the new state: the table's user columns (keys and values), one
                row per key; its values are converted to the table's types as an
                epoch's are (a value that does not fit is refused, named).
            through: the newest epoch; no later epoch may be recorded.
            label: the rebuild's id, recorded in the commit (see ``rebased_by``).
            metadata: more commitInfo entries (the logic version).

        Returns:
            The Delta version of the commit.

        Raises:
            InvalidInputError: other columns than the table's, a repeated or NULL
                key, a value that does not fit, or an epoch after ``through``
                recorded; nothing was written.
            FencedError: a newer generation has taken over; nothing was written.
            RetryableError: the table changed under the rebase; nothing was written.
        """
        table = self._delta()
        if table is None or self._schema is None:
            raise InvalidInputError(
                f"table {self.uri!r} holds no epoch: there is nothing to rebuild",
                table=self.uri,
            )
        user = self._schema
        if set(new.column_names) != set(user.names):
            raise InvalidInputError(
                f"table {self.uri!r}: a rebuild keeps the table's columns {user.names}; the "
                f"new logic gives {new.column_names} (add columns by schema evolution first); "
                "nothing was written",
                table=self.uri,
            )
        upserts = new.select(user.names).append_column(
            OP_COLUMN, pa.repeat(pa.scalar("upsert"), new.num_rows)
        )
        net, _ = normalize_changes(upserts, keys=self.key_columns, schema=user, table=self.uri,
                                   types=self.column_types)  # fmt: skip
        if net.upserts.num_rows != new.num_rows:
            raise InvalidInputError(
                f"table {self.uri!r}: the new state holds {new.num_rows - net.upserts.num_rows} "
                "repeated keys; a rebuild needs one row per key; nothing was written",
                table=self.uri,
            )
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
            files = live_files(table, name=self.uri)
            rows = self._rebased_rows(net.upserts, self._state_of(files), through)
            added = self._write(rows, through)
            hooks.point(REBASE_WRITTEN)
            landed = self._landed({f.path for f in added})

            try:
                commit = DeltaCommit(
                    table_uri=self.uri,
                    schema=stored_schema(user, self.key_columns),
                    app_id=self._fence,
                    version=self.generation,
                    add=added,
                    remove=[DataFile(f.path, f.size, 0, "", 0) for f in files],
                    fence=(self._fence, self.generation),
                    custom_metadata={
                        **metadata,
                        REBUILD_LABEL: label,
                        "reconcile.compacted_through": through,
                        "reconcile.generation": self.generation,
                    },
                    check_schema=False,  # written from the stored schema here
                )
                done = commit_files(commit, BasedOn(table, landed=landed))
                found = done.table_version
                if found is None:
                    found = self.rebased_by(label)
                if found is None:  # pragma: no cover - commit_files raises rather
                    raise RetryableError(f"table {self.uri!r}: the rebase did not land")
                return found
            except RetryableError:
                # An apply of the same writer (a compaction's commit) landed between
                # the read and the commit: the files we replace may be gone; again.
                if attempt == _COMMIT_ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _landed(self, names: set[str]) -> Callable[[], bool]:
        def landed() -> bool:
            fresh = DeltaTable(self.uri)
            return names <= {f.path for f in live_files(fresh, name=self.uri)}

        return landed

    def _rebased_rows(self, upserts: pa.Table, old: pa.Table, through: int) -> pa.Table:
        """The new stored rows: an unchanged row keeps its ``_epoch``, the others get ``through``.

        Same means the same row hash as the old state's row of that key.
        """
        assert self._schema is not None
        keys = self.key_columns
        hashes = row_hash_arrow(upserts, self._schema.names)
        probe = upserts.select(keys).append_column(ROW_HASH_COLUMN, hashes)
        probe = probe.append_column("_position", pa.array(range(upserts.num_rows), pa.int64()))
        before = old.select([*keys, ROW_HASH_COLUMN, EPOCH_COLUMN]).rename_columns(
            [*keys, "_old_hash", "_old_epoch"]
        )
        joined = probe.join(before, keys, join_type="left outer").sort_by("_position")
        same = pc.fill_null(pc.equal(joined.column(ROW_HASH_COLUMN), joined.column("_old_hash")),
                            False)  # fmt: skip
        epochs = pc.if_else(same, joined.column("_old_epoch"), pa.scalar(through, pa.int64()))
        schema = stored_schema(self._schema, keys)
        return pa.table(
            [
                *upserts.columns,
                hashes,
                epochs.cast(pa.int64()),
                pa.repeat(pa.scalar("upsert"), upserts.num_rows),
            ],
            schema=schema,
        )

    def _write(self, rows: pa.Table, through: int) -> list[DataFile]:
        per_row = max(1, rows.nbytes // max(1, rows.num_rows))
        per_file = max(1, DEFAULT_TARGET_SIZE // per_row)
        tag = uuid.uuid4().hex
        added = []
        for part, start in enumerate(range(0, max(rows.num_rows, 1), per_file)):
            chunk = rows.slice(start, per_file)
            if chunk.num_rows or part == 0:
                added.append(write_data_file(self.uri, base_file_name(through, tag, part), chunk))
        return added
