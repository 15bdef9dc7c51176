"""The expected-state store: one Delta table per (pipeline, sink table), one commit per epoch."""

from __future__ import annotations

import bisect
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
import pyarrow.compute as pc  # type: ignore[import-untyped, unused-ignore]
import pyarrow.parquet as pq  # type: ignore[import-untyped, unused-ignore]
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from expected_state.changes import normalize_changes
from expected_state.delta_commit import DataFile, commit_files, make_durable, write_data_file
from expected_state.epochs import EpochLog
from expected_state.fencing import check_generation, fence_app_id, validate_generation
from expected_state.housekeeping import Housekeeping
from reconcile import hooks
from reconcile.contract import Change, EpochOrderError, InvalidInputError, validate_name
from reconcile.hashing import row_hash_arrow

__all__ = ["APPLY_CHECKED", "APPLY_TABLE_MISSING", "ApplyResult", "ExpectedStateStore"]

# Between apply()'s order and fence checks and its commit (data files are written
# in between): a takeover here must still make the commit fail.
APPLY_CHECKED = hooks.declare("expected_state.apply.checked")
# apply() found no table and is about to create it: another writer may create
# it, and record epochs, right here.
APPLY_TABLE_MISSING = hooks.declare("expected_state.apply.table_missing")

# Table properties set at creation. Log cleanup is off so that every recorded
# epoch stays reachable by time travel until vacuum() decides otherwise (the
# epoch -> version map is only useful while the log still holds the version).
# A checkpoint every 10 commits bounds the JSON replay that each small epoch's
# commit and refresh pay (measured: ~4 ms median at delta-rs' default of 100,
# ~1.5 ms at 10, for 100-row epochs).
_TABLE_CONFIG = {"delta.enableExpiredLogCleanup": "false", "delta.checkpointInterval": "10"}


@dataclass(frozen=True, slots=True)
class ApplyResult:
    """What :meth:`ExpectedStateStore.apply` did.

    Attributes:
        epoch: the epoch.
        applied: True if this call committed it; False if it was already recorded.
        table_version: the Delta version holding the epoch (None if unknown).
        upserted: rows inserted or replaced (0 on a no-op).
        deleted: keys deleted that existed (0 on a no-op).
    """

    epoch: int
    applied: bool
    table_version: int | None
    upserted: int = 0
    deleted: int = 0


class ExpectedStateStore(Housekeeping):
    """The expected state of one sink table of one pipeline, as a Delta table.

    Layout under ``root``: ``<root>/<pipeline>/<sink>/`` is the Delta table
    (key columns, value columns, ``_row_hash`` int64, ``_epoch`` int64) and
    ``<root>/_epochs/`` the store-wide epochs table (see :class:`EpochLog`).
    Each epoch is ONE Delta commit carrying ``Transaction("<pipeline>/<sink>",
    epoch)`` and ``Transaction("<pipeline>/<sink>#generation", generation)``.
    """

    def __init__(
        self,
        root: str,
        pipeline: str,
        sink: str,
        key_columns: Sequence[str],
        *,
        schema: pa.Schema | None = None,
        generation: int = 0,
    ) -> None:
        """Open (lazily) the store table of ``pipeline``/``sink``.

        Args:
            root: the store root, a local path or a URI deltalake understands.
            pipeline: pipeline name ([A-Za-z0-9_]).
            sink: sink table name ([A-Za-z0-9_]).
            key_columns: the key columns, in order.
            schema: the user schema (keys + values); default: the existing table's,
                or inferred from the first epoch's upserts.
            generation: this writer's fencing generation; call :meth:`claim` to take over.

        Raises:
            ConfigurationError: a bad name.
            InvalidInputError: no key columns, or keys not in ``schema``.
        """
        self.root = str(root).rstrip("/")
        self.pipeline = validate_name("pipeline", pipeline)
        self.sink = validate_name("sink", sink)
        self.uri = f"{self.root}/{pipeline}/{sink}"
        self.app_id = f"{pipeline}/{sink}"
        self.key_columns = list(key_columns)
        if not self.key_columns:
            raise InvalidInputError(f"table {self.uri!r}: at least one key column is needed")
        self.generation = validate_generation(generation)
        self.epochs = EpochLog(self.root, pipeline, sink, generation=generation)
        self._fence = fence_app_id(pipeline, sink)
        self._table: DeltaTable | None = None
        self._schema: pa.Schema | None = schema
        self._key_cache: dict[str, pa.Table] = {}
        self._versions: dict[int, int] = {}
        self._versions_upto = -1
        if schema is not None:
            missing = [k for k in self.key_columns if k not in schema.names]
            if missing:
                raise InvalidInputError(
                    f"table {self.uri!r}: key column {missing[0]!r} is not in the schema "
                    f"{schema.names}",
                    table=self.uri,
                    column=missing[0],
                )

    # -- opening ---------------------------------------------------------------

    def _delta(self, *, refresh: bool = True) -> DeltaTable | None:
        """The state table at its newest version (cached, updated incrementally)."""
        if self._table is None:
            try:
                self._table = DeltaTable(self.uri)
            except TableNotFoundError:
                return None
        elif refresh:
            self._table.update_incremental()
        if self._schema is None:
            stored = pa.schema(self._table.schema().to_arrow())
            self._schema = pa.schema([f for f in stored if f.name not in ("_row_hash", "_epoch")])
        return self._table

    @property
    def user_schema(self) -> pa.Schema | None:
        """Key and value columns, as stored (None before the first epoch)."""
        self._delta()
        return self._schema

    def _state_schema(self, user: pa.Schema) -> pa.Schema:
        return user.append(pa.field("_row_hash", pa.int64(), nullable=False)).append(
            pa.field("_epoch", pa.int64(), nullable=False)
        )

    def claim(self) -> None:
        """Take over as the writer: record this generation in the state and epochs tables.

        Raises:
            FencedError: a newer generation has already taken over.
        """
        table = self._delta()
        if table is None:
            if self._schema is None:
                raise InvalidInputError(
                    f"table {self.uri!r}: claim() before the first epoch needs schema=",
                    table=self.uri,
                )
            DeltaTable.create(
                self.uri,
                self._state_schema(self._schema),
                mode="ignore",
                configuration=_TABLE_CONFIG,
            )
            table = self._delta()
            assert table is not None
        check_generation(table, self._fence, self.generation, table_name=self.uri)
        if table.transaction_version(self._fence) != self.generation:
            # Fenced on the snapshot the claim commits on: a claim never lowers the fence.
            commit_files(self.uri, [], self._state_schema(self._schema), app_id=self._fence,
                         version=self.generation, fence=(self._fence, self.generation),
                         table_name=self.uri, table=table)  # fmt: skip
        self.epochs.claim()

    # -- writing ---------------------------------------------------------------

    def last_epoch(self) -> int | None:
        """The newest epoch applied (from the state table's own log), or None."""
        table = self._delta()
        return None if table is None else table.transaction_version(self.app_id)

    def apply(
        self, epoch: int, changes: Iterable[Change] | pa.Table, *, allow_gap: bool = False
    ) -> ApplyResult:
        """Record epoch ``epoch``'s changes in ONE atomic, idempotent Delta commit.

        Upserts replace the row of their key; deletes drop it from the current
        version (older versions keep it for time travel). Within one epoch the
        last change of a key wins.

        Args:
            epoch: the epoch, >= 0; the first epoch may be any number.
            changes: Change objects, or an Arrow table of the user columns plus a
                string column ``_op`` ("upsert"/"delete"); the Arrow form is the
                fast path for large epochs.
            allow_gap: accept an epoch more than one past the last one.

        Returns:
            What was done; ``applied`` is False when the epoch was already recorded.

        Raises:
            EpochOrderError: the epoch goes backwards to an unrecorded epoch, or skips
                without ``allow_gap``; nothing was written.
            InvalidInputError: the changes do not fit the table (the column is named).
            FencedError: a newer generation has taken over; nothing was written.
            RetryableError: lost to concurrent writers too often; nothing was written.
            OutcomeUnknownError: the commit's fate could not be read back.
        """
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise InvalidInputError(
                f"table {self.uri!r}: epoch must be an int >= 0, got {epoch!r}; "
                "nothing was written",
                table=self.uri,
                value=repr(epoch),
            )
        table = self._delta()
        if table is not None:
            if self._already_applied(table, epoch, allow_gap=allow_gap):
                return ApplyResult(epoch, applied=False, table_version=None)
            check_generation(table, self._fence, self.generation, table_name=self.uri)
        net, user_schema = normalize_changes(
            changes, keys=self.key_columns, schema=self._schema, table=self.uri
        )
        self._schema = user_schema
        schema = self._state_schema(user_schema)
        if table is None:
            hooks.point(APPLY_TABLE_MISSING)
            DeltaTable.create(self.uri, schema, mode="ignore", configuration=_TABLE_CONFIG)
            make_durable(self.uri, 0, 0)
            table = self._delta()
            assert table is not None
            # Another writer may have created the table, and recorded epochs in it,
            # since we found none: the order and the fence are decided on this
            # snapshot, the one the commit is based on, never on the empty look.
            if self._already_applied(table, epoch, allow_gap=allow_gap):
                return ApplyResult(epoch, applied=False, table_version=None)
            check_generation(table, self._fence, self.generation, table_name=self.uri)
        hooks.point(APPLY_CHECKED)
        adds: list[DataFile] = []
        removes, kept, deleted = self._rewrite_touched(table, net.touched, net.deletes, epoch)
        adds.extend(kept)
        if net.upserts.num_rows:
            hashes = row_hash_arrow(net.upserts, user_schema.names)
            rows = net.upserts.append_column("_row_hash", hashes).append_column(
                "_epoch", pa.array(np.full(net.upserts.num_rows, epoch, dtype=np.int64))
            )
            rows = pa.table(rows.columns, schema=schema)
            adds.append(self._write(rows, epoch))
        # The snapshot the token, order and fence were read from is the one the
        # commit is based on: a commit by another writer (a takeover, a replay of
        # this epoch) after it makes delta-rs reject ours (FencedError, or a no-op).
        result = commit_files(
            self.uri,
            adds,
            schema,
            app_id=self.app_id,
            version=epoch,
            remove=removes,
            fence=(self._fence, self.generation),
            custom_metadata={
                "reconcile.epoch": epoch,
                "reconcile.generation": self.generation,
                "reconcile.upserted": net.upserts.num_rows,
                "reconcile.deleted": deleted,
            },
            check_schema=False,  # every file was written here from `schema`
            token_checked=True,  # read by _already_applied from this very snapshot
            table_name=self.uri,
            table=table,
        )
        if not result.committed:
            return ApplyResult(epoch, applied=False, table_version=None)
        # The epoch -> version map is read back from this very commit's commitInfo
        # (epoch_versions), so there is no second table to keep consistent and no
        # crash window between two commits.
        return ApplyResult(
            epoch,
            applied=True,
            table_version=result.table_version,
            upserted=net.upserts.num_rows,
            deleted=deleted,
        )

    def _already_applied(self, table: DeltaTable, epoch: int, *, allow_gap: bool) -> bool:
        """Whether ``epoch`` is recorded in ``table``'s snapshot; raise if it is out of order.

        Raises:
            EpochOrderError: the epoch goes back to an epoch never recorded, or
                skips epochs without ``allow_gap``; nothing was written.
        """
        last = table.transaction_version(self.app_id)
        if last is not None and epoch <= last:
            # Replay after a crash or a retried cycle: the token says it is in.
            # Only an epoch that was actually recorded is a no-op; going back to an
            # epoch that was skipped over would rewrite history, so it is an error.
            if epoch == last or epoch in self.epoch_versions():
                return True
            raise EpochOrderError(
                f"table {self.uri!r}: epoch {epoch} goes backwards (last applied epoch is "
                f"{last}, and {epoch} was never recorded); nothing was written",
                table=self.uri,
                epoch=epoch,
                last_epoch=last,
            )
        if last is not None and epoch > last + 1 and not allow_gap:
            raise EpochOrderError(
                f"table {self.uri!r}: epoch {epoch} skips epochs {last + 1}..{epoch - 1} "
                "(pass allow_gap=True if they have no output); nothing was written",
                table=self.uri,
                epoch=epoch,
                last_epoch=last,
            )
        return False

    def _write(self, rows: pa.Table, epoch: int) -> DataFile:
        rel = f"part-e{epoch:012d}-{uuid.uuid4().hex}.parquet"
        data_file = write_data_file(self.uri, rel, rows)
        self._key_cache[rel] = rows.select(self.key_columns)
        return data_file

    def _rewrite_touched(
        self, table: DeltaTable, touched: pa.Table, deletes: pa.Table, epoch: int
    ) -> tuple[list[DataFile], list[DataFile], int]:
        """Rewrite every active file holding a touched key, without those rows.

        Returns the files to remove, their rewritten replacements, and how many
        deleted keys actually existed.
        """
        if touched.num_rows == 0:
            return [], [], 0
        actions = pa.table(table.get_add_actions(flatten=True))
        live = {p: None for p in actions.column("path").to_pylist()}
        for stale in [p for p in self._key_cache if p not in live]:
            del self._key_cache[stale]  # files leave the snapshot for good: forget them
        single = len(self.key_columns) == 1
        key = self.key_columns[0]
        sorted_keys = sorted(touched.column(key).to_pylist()) if single else []
        removes: list[DataFile] = []
        kept: list[DataFile] = []
        deleted = 0
        deleted_keys = deletes
        for row in actions.to_pylist():
            low, high = row.get(f"min.{key}"), row.get(f"max.{key}")
            if single and low is not None and high is not None:
                # Min/max pruning: skip a file whose key range holds no touched key.
                i = bisect.bisect_left(sorted_keys, low)
                if i == len(sorted_keys) or sorted_keys[i] > high:
                    continue
            path = row["path"]
            file_keys = self._key_cache.get(path)
            if file_keys is None:
                file_keys = pq.read_table(f"{self.uri}/{path}", columns=self.key_columns)
                self._key_cache[path] = file_keys
            hit = _member_mask(file_keys, touched, self.key_columns)
            if not pc.any(hit).as_py():
                continue
            if deleted_keys.num_rows:
                deleted += int(
                    pc.sum(_member_mask(file_keys, deleted_keys, self.key_columns)).as_py() or 0
                )
            removes.append(DataFile(path, row["size_bytes"], row["num_records"] or 0, "", 0))
            survivors = pq.read_table(f"{self.uri}/{path}").filter(pc.invert(hit))
            if survivors.num_rows:
                kept.append(self._write(survivors, epoch))
        return removes, kept, deleted

    # -- reading ---------------------------------------------------------------

    def epoch_versions(self) -> dict[int, int]:
        """Epoch -> Delta version of every recorded epoch, oldest first.

        Read from the commitInfo that each apply() commit carries (the same
        atomic commit as the data and the token), incrementally: only commits
        newer than the last call are read.
        """
        table = self._delta()
        if table is None:
            return {}
        current = table.version()
        if current > self._versions_upto:
            for commit in table.history(limit=current - self._versions_upto):
                epoch = commit.get("reconcile.epoch")
                if epoch is not None and commit.get("reconcile.app_id") == self.app_id:
                    self._versions[int(epoch)] = int(commit["version"])
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
        if not recorded or last is None or epoch > last:
            raise InvalidInputError(
                f"table {self.uri!r}: epoch {epoch} is not recorded (recorded: "
                f"{min(versions) if versions else None}..{last})",
                table=self.uri,
                epoch=epoch,
            )
        return versions[max(recorded)]

    def snapshot(self, epoch: int | None = None, columns: Sequence[str] | None = None) -> pa.Table:
        """The expected state as of ``epoch`` (default: the newest), as Arrow.

        Args:
            epoch: a recorded epoch (or one skipped over), or None for the newest.
            columns: the columns to read (default all: keys, values, _row_hash, _epoch).

        Returns:
            One row per key.

        Raises:
            InvalidInputError: the epoch is not recorded, or vacuum removed its files.
        """
        table = self._delta()
        if table is None:
            if self._schema is None:
                return pa.table({})
            return self._state_schema(self._schema).empty_table()
        if epoch is not None:
            version = self.version_of(epoch)
            table = DeltaTable(self.uri, version=version)
        try:
            return pa.table(table.to_pyarrow_table(columns=list(columns) if columns else None))
        except (OSError, FileNotFoundError) as exc:
            raise InvalidInputError(
                f"table {self.uri!r}: the files of epoch {epoch} are gone (vacuumed?): {exc}",
                table=self.uri,
                epoch=epoch,
            ) from exc

    def changed_keys(self, since_epoch: int) -> pa.Table:
        """Keys whose expected state changed after ``since_epoch``.

        Returns the key columns plus ``_deleted`` (bool): keys upserted by a later
        epoch (``_deleted`` False) and keys present at ``since_epoch`` but absent
        now (True). A key inserted and deleted again after ``since_epoch`` is a
        net no-op and is not listed.
        """
        keys = self.key_columns
        now = self.snapshot(columns=[*keys, "_epoch"])
        upserted = now.filter(pc.greater(now.column("_epoch"), since_epoch)).select(keys)
        # Only files that left the snapshot since then can hold deleted keys.
        then_version = self.version_of(since_epoch)
        then_files = set(DeltaTable(self.uri, version=then_version).file_uris())
        now_files = set(DeltaTable(self.uri).file_uris())
        gone = sorted(then_files - now_files)
        if gone:
            old = (
                pq.read_table(gone, columns=keys)
                if len(gone) > 1
                else pq.read_table(gone[0], columns=keys)
            )
            removed = old.filter(pc.invert(_member_mask(old, now.select(keys), keys)))
        else:
            removed = pa.table({k: pa.array([], now.schema.field(k).type) for k in keys})
        return pa.concat_tables(
            [
                upserted.append_column(
                    "_deleted", pa.array([False] * upserted.num_rows, pa.bool_())
                ),
                removed.append_column("_deleted", pa.array([True] * removed.num_rows, pa.bool_())),
            ]
        )

    def _describe(self) -> dict[str, Any]:
        return {"uri": self.uri, "pipeline": self.pipeline, "sink": self.sink}


def _member_mask(data: pa.Table, keys: pa.Table, columns: Sequence[str]) -> pa.Array:
    """For each row of ``data``, whether its key is among ``keys``."""
    if len(columns) == 1:
        return pc.fill_null(
            pc.is_in(data.column(columns[0]), value_set=keys.column(columns[0]).combine_chunks()),
            False,
        )
    indexed = data.select(list(columns)).append_column(
        "_row", pa.array(np.arange(data.num_rows, dtype=np.int64))
    )
    hits = indexed.join(keys.select(list(columns)).group_by(list(columns)).aggregate([]),
                        keys=list(columns), join_type="left semi")  # fmt: skip
    mask = np.zeros(data.num_rows, dtype=bool)
    mask[hits.column("_row").to_numpy()] = True
    return pa.array(mask)
