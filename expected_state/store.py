"""The expected-state store: one merge-on-read Delta table per (pipeline, sink table).

Each epoch appends ONE change file in ONE tokened, fenced Delta commit; nothing
on the write path reads or rewrites what earlier epochs wrote, so an epoch
costs in proportion to its own size. ``compact()`` folds change files into a
base off the write path; readers merge the base and the changes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
from deltalake import DeltaTable

from expected_state.apply_result import ApplyResult
from expected_state.change_reading import ChangeReading
from expected_state.changes import EpochChanges, normalize_changes
from expected_state.column_types import infer_user_schema
from expected_state.compaction import Compaction
from expected_state.delta_commit import (
    BasedOn,
    DataFile,
    DeltaCommit,
    commit_files,
    describe_data_file,
)
from expected_state.delta_log import remember_written
from expected_state.epoch_file import EpochFile, remove_epoch_file, write_epoch_file
from expected_state.evolving import Evolving
from expected_state.fencing import (
    check_generation,
    check_recorded_generation,
)
from expected_state.holds import Holding
from expected_state.housekeeping import Housekeeping
from expected_state.layout import (
    stored_schema,
)
from expected_state.parts import PartWriter
from expected_state.rebasing import Rebasing
from expected_state.reverting import Reverting
from expected_state.store_table import StoreTable
from expected_state.trust import Trusting
from reconcile.core import hooks
from reconcile.core.contract import (
    Change,
    EpochOrderError,
    InvalidInputError,
    RetryableError,
)

__all__ = [
    "APPLY_CHECKED",
    "APPLY_TABLE_MISSING",
    "ApplyResult",
    "ExpectedStateStore",
]

# Between apply()'s order and fence checks and its commit (the change file is
# written in between): a takeover here must still make the commit fail.
APPLY_CHECKED = hooks.declare("expected_state.apply.checked")
# apply() found no table and is about to create it: another writer may create
# it, and record epochs, right here.
APPLY_TABLE_MISSING = hooks.declare("expected_state.apply.table_missing")
# A commit that lost to a concurrent commit of the same writer (a compaction's
# commit carries the same fence token) wrote nothing and is simply made again on
# a fresh snapshot, with the same change file.
_COMMIT_ATTEMPTS = 3


class ExpectedStateStore(  # Holding first: the others' _hold stubs are its
    Holding,
    StoreTable,
    Evolving,
    Trusting,
    ChangeReading,
    Reverting,
    Rebasing,
    Compaction,
    Housekeeping,
):
    """The expected state of one sink table of one pipeline, as a merge-on-read Delta table.

    Layout under ``root``: ``<root>/<pipeline>/<sink>/`` is the Delta table
    (key columns, value columns, ``_row_hash``, ``_epoch``, ``_op``): one change
    file per epoch and a compacted base; ``<root>/_epochs/`` the store-wide
    epochs table (:class:`EpochLog`, :class:`~expected_state.progress_log.StoreProgressLog`).
    Each epoch is ONE Delta commit carrying ``Transaction("<pipeline>/<sink>",
    epoch)`` and ``Transaction("<pipeline>/<sink>#generation", generation)``.

    Opening, the schema, the tokens and ``claim`` are :class:`StoreTable`'s;
    recording epochs (``apply``, ``apply_parts``) is here.
    """

    # -- writing ---------------------------------------------------------------

    def normalize(self, changes: Iterable[Change] | pa.Table) -> EpochChanges:
        """An epoch's changes checked and converted to this table's schema, as ``apply`` would.

        What the commit cycle does when it stages an epoch, so that a value that
        does not fit is refused before anything is decided; ``apply`` then takes
        the result as it is. Reads the table's schema once (no refresh after).

        Raises:
            InvalidInputError: as ``apply``, naming the column and the value.
        """
        if self._schema is None:
            self._delta(refresh=False)
        net, _ = normalize_changes(
            changes, keys=self.key_columns, schema=self._schema, table=self.uri,
            types=self.column_types,
        )  # fmt: skip
        return net

    def write_ahead(self, epoch: int, net: EpochChanges) -> EpochFile | None:
        """Write ``epoch``'s change file now; ``apply(epoch, <it>)`` commits it later.

        The row hashes and the Parquet file are the part of ``apply`` that
        needs nothing of the table's log, so the commit cycle writes them
        while the sinks prepare the epoch, and its commit point is left with
        the Delta commit. The file is invisible until that commit; remove it
        with ``discard_ahead`` if the epoch is aborted. None (nothing written)
        for a table that does not exist yet: its first epoch is written by
        ``apply``, which creates the table and checks its key types first.
        """
        if self._schema is None or self._delta(refresh=False) is None:
            return None
        return write_epoch_file(self.uri, epoch, net, self.key_columns,
                                self._stored_schema(net.upserts.schema))  # fmt: skip

    def discard_ahead(self, written: EpochFile) -> None:
        """Remove a file ``write_ahead`` wrote for an epoch that was aborted (best effort)."""
        remove_epoch_file(self.uri, written)

    def apply(
        self,
        epoch: int,
        changes: Iterable[Change] | pa.Table | EpochChanges | EpochFile,
        *,
        allow_gap: bool = False,
    ) -> ApplyResult:
        """Record epoch ``epoch``'s changes in ONE atomic, idempotent Delta commit.

        The changes go into one new change file (upserts, and tombstones for
        deletes); no earlier file is read or rewritten. Within one epoch the last
        change of a key wins.

        Args:
            epoch: the epoch, >= 0; the first epoch may be any number.
            changes: Change objects, or an Arrow table of the user columns plus a
                string column ``_op`` ("upsert"/"delete"); the Arrow form is the
                fast path for large epochs. Or what :meth:`normalize` made of them,
                or the file :meth:`write_ahead` wrote of those (committed as it is).
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
        written = changes if isinstance(changes, EpochFile) else None
        if written is not None:
            if written.epoch != epoch:
                raise InvalidInputError(
                    f"table {self.uri!r}: the file written ahead is epoch {written.epoch}'s, "
                    f"not epoch {epoch}'s; nothing was written",
                    table=self.uri,
                    epoch=epoch,
                )
            changes = written.net
        table = self._delta()
        if table is not None:
            if self._already_applied(table, epoch, allow_gap=allow_gap):
                return ApplyResult(epoch, applied=False, table_version=None)
            fence = self._tokens(table)[1]
            check_recorded_generation(fence, self.generation, table_name=self.uri)
        if isinstance(changes, EpochChanges):
            net, user_schema = changes, changes.upserts.schema
            if self._schema is not None and not user_schema.equals(self._schema):
                # The table was created (by another writer) since the changes were
                # converted: convert them again, when the epoch is run again.
                raise RetryableError(
                    f"table {self.uri!r}: its schema is {self._schema}, not the {user_schema} "
                    f"epoch {epoch}'s changes were converted to; nothing was written",
                    table=self.uri,
                    epoch=epoch,
                )
        else:
            net, user_schema = normalize_changes(
                changes, keys=self.key_columns, schema=self._schema, table=self.uri,
                types=self.column_types,
            )  # fmt: skip
        self._schema = user_schema
        schema = self._stored_schema(user_schema)
        if table is None:
            hooks.point(APPLY_TABLE_MISSING)
            table = self._create(user_schema)
            # Another writer may have created the table, and recorded epochs in it,
            # since we found none: the order and the fence are decided on this
            # snapshot, the one the commit is based on, never on the empty look.
            if self._already_applied(table, epoch, allow_gap=allow_gap):
                return ApplyResult(epoch, applied=False, table_version=None)
            check_generation(table, self._fence, self.generation, table_name=self.uri)
        elif self._evolving is not None:
            # The epoch brings new columns: the new schema is committed first
            # (expected_state.evolving), and the order and fence decided again
            # on the snapshot that holds it.
            table = self._commit_new_columns(table, epoch)
            if self._already_applied(table, epoch, allow_gap=allow_gap):
                return ApplyResult(epoch, applied=False, table_version=None)
            check_generation(table, self._fence, self.generation, table_name=self.uri)
        hooks.point(APPLY_CHECKED)
        if written is None:
            written = write_epoch_file(self.uri, epoch, net, self.key_columns, schema)
        return self._commit_epoch(
            table, epoch, list(written.files), schema, upserted=net.upserts.num_rows,
            deleted=net.deletes.num_rows, allow_gap=allow_gap,
        )  # fmt: skip

    def part_writer(self, user_schema: pa.Schema) -> PartWriter:
        """The writer executors record an epoch's parts with; creates the table if it has no epoch.

        Args:
            user_schema: the columns the executors will write (keys first);
                checked against the table's when it has one.

        Raises:
            InvalidInputError: a column missing or of another type than the
                table's (naming it); nothing was written.
        """
        table = self._delta()
        if table is None or self._schema is None:
            # As apply() infers a first epoch's schema: keys first, the sink's
            # types where it has them, else the frame's, widened.
            schema = self._schema or infer_user_schema(
                user_schema, self.key_columns, self.column_types, table=self.uri
            )
            self._create(schema)
        assert self._schema is not None
        writer = PartWriter(self.uri, tuple(self.key_columns), self._schema, self.column_types)
        writer.net(user_schema.empty_table())  # the same check a part makes, before any runs
        return writer

    def apply_parts(
        self,
        epoch: int,
        paths: Sequence[str],
        *,
        upserted: int,
        deleted: int,
        allow_gap: bool = False,
    ) -> ApplyResult:
        """Record ``epoch`` as the change files executors wrote, in ONE tokened commit.

        Args:
            epoch: the epoch.
            paths: the files (relative to the table root) of the task attempts
                Spark kept; written by :class:`PartWriter` for this epoch.
            upserted: the rows they upsert (net), as the tasks counted them.
            deleted: the rows they delete (net), as the tasks counted them.
            allow_gap: as for ``apply``.

        Raises:
            EpochOrderError, FencedError, RetryableError, OutcomeUnknownError: as ``apply``.
            InvalidInputError: the table does not exist (``part_writer`` creates
                it), or a file is not of the table's schema (naming it).
        """
        table = self._delta()
        if table is None or self._schema is None:
            raise InvalidInputError(
                f"table {self.uri!r}: no store table to add epoch {epoch}'s files to "
                "(part_writer() creates it before executors write); nothing was written",
                table=self.uri,
                epoch=epoch,
            )
        if self._already_applied(table, epoch, allow_gap=allow_gap):
            return ApplyResult(epoch, applied=False, table_version=None)
        check_recorded_generation(self._tokens(table)[1], self.generation, table_name=self.uri)
        adds = [describe_data_file(self.uri, p) for p in paths]
        return self._commit_epoch(
            table,
            epoch,
            adds,
            stored_schema(self._schema, self.key_columns),
            upserted=upserted,
            deleted=deleted,
            allow_gap=allow_gap,
            check_schema=True,
        )

    def _commit_epoch(
        self,
        table: DeltaTable,
        epoch: int,
        adds: list[DataFile],
        schema: pa.Schema,
        *,
        upserted: int,
        deleted: int,
        allow_gap: bool,
        check_schema: bool = False,
    ) -> ApplyResult:
        """Add an epoch's change files (written already) in ONE tokened, fenced commit.

        ``table`` is the snapshot the epoch's order and fence were checked on:
        the first attempt is based on it, so a takeover since makes it fail.
        """
        metadata: dict[str, Any] = {
            "reconcile.epoch": epoch,
            "reconcile.generation": self.generation,
            "reconcile.upserted": upserted,
            "reconcile.deleted": deleted,
            # Every file of the epoch, so that readers find them after compaction
            # folded them (one, unless Spark executors wrote the epoch in parts).
            "reconcile.file": ",".join(a.path for a in adds),
        }
        for attempt in range(_COMMIT_ATTEMPTS):
            if attempt:
                # The last attempt lost to a concurrent commit of this writer (a
                # compaction): nothing was written. Decide again on a new snapshot.
                fresh = self._delta()
                assert fresh is not None
                table = fresh
                if self._already_applied(table, epoch, allow_gap=allow_gap):
                    return ApplyResult(epoch, applied=False, table_version=None)
                check_generation(table, self._fence, self.generation, table_name=self.uri)
            based_on = table.version()
            try:
                # The snapshot the token, order and fence were read from is the one
                # the commit is based on: a commit by another writer (a takeover, a
                # replay of this epoch) after it makes delta-rs reject ours.
                recording = DeltaCommit(
                    table_uri=self.uri,
                    schema=schema,
                    app_id=self.app_id,
                    version=epoch,
                    add=adds,
                    fence=(self._fence, self.generation),
                    custom_metadata=metadata,
                    # apply() wrote its file from `schema` here; files from
                    # elsewhere (executors) are checked: delta-rs does not.
                    check_schema=check_schema,
                )
                # token_checked: read by _already_applied from this very snapshot.
                result = commit_files(recording, BasedOn(table, token_checked=True))
            except RetryableError:
                if attempt == _COMMIT_ATTEMPTS - 1:
                    raise
                continue
            if not result.committed:
                return ApplyResult(epoch, applied=False, table_version=None)
            if result.table_version == based_on + 1:
                # Our commit is the one right after our snapshot: nothing else in it.
                remember_written(table, based_on + 1, {self.app_id: epoch,
                                                        self._fence: self.generation})  # fmt: skip
            # The epoch -> version map is read back from this very commit's
            # commitInfo (epoch_versions): no second table to keep consistent.
            return ApplyResult(
                epoch,
                applied=True,
                table_version=result.table_version,
                upserted=upserted,
                deleted=deleted,
            )
        raise AssertionError("unreachable")  # pragma: no cover

    def _already_applied(self, table: DeltaTable, epoch: int, *, allow_gap: bool) -> bool:
        """Whether ``epoch`` is recorded in ``table``'s snapshot; raise if it is out of order.

        Raises:
            EpochOrderError: the epoch goes back to an epoch never recorded, or
                skips epochs without ``allow_gap``; nothing was written.
        """
        last = self._token(table)
        if last is not None and epoch <= last:
            # Replay after a crash or a retried cycle: the token says it is in.
            # Only an epoch that was actually recorded is a no-op; going back to an
            # epoch that was skipped over would rewrite history, so it is an error.
            versions = self.epoch_versions()
            if epoch == last or epoch in versions:
                return True
            if self._history_from > 0 and versions and epoch < min(versions):
                why = f"older than the log vacuum kept (from epoch {min(versions)})"
            else:
                why = f"and {epoch} was never recorded"
            raise EpochOrderError(
                f"table {self.uri!r}: epoch {epoch} goes backwards (last applied epoch is "
                f"{last}, {why}); nothing was written",
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
