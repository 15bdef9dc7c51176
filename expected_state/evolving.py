"""Evolving a store table's schema: new nullable columns, in the epoch that brings them.

``evolve(change)`` makes the table's schema the change's, for the epoch being
staged: ``normalize``, ``write_ahead`` and ``apply`` then take the epoch's rows
in the new schema. ``apply`` commits the new schema just before the epoch's own
commit (``commit_new_columns``), fenced by this writer's generation; if the
epoch is aborted instead, ``abandon_evolution`` goes back to the table's.

Why a commit of its own, through delta-rs's ``write_deltalake(schema_mode=
"merge")`` of an empty table: the store adds its change files with
``create_write_transaction``, which commits the files but never a new schema
(delta-rs writes a ``metaData`` action only from its own writers); a merge of
an empty table writes exactly the ``metaData`` action (no file), keeps the
table's properties, and carries our fence token. It is idempotent: a replay of
the epoch after a crash between the two commits finds the columns there, plans
no change, and commits the epoch alone. A table with the new columns but
without the epoch is a valid table (the columns read NULL everywhere), so no
crash between the two commits leaves anything to undo.

What delta-rs refuses is refused here too, before anything is written: it has
no type widening ("Cannot merge field ... from Decimal128(18, 4) to
Decimal128(10, 2)"), and a wider type also changes every stored row's hash, so
a store column keeps its Arrow type; the widenings a store allows are those
that leave its Arrow type as it is (a longer ``varchar`` or ``text`` in the
sink: a string either way).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError, DeltaError

from expected_state.column_types import check_column_names
from expected_state.delta_commit import make_durable
from expected_state.evolved_files import ADDED_EPOCH
from expected_state.fencing import check_generation
from expected_state.layout import stored_schema, user_schema_of
from expected_state.protocol import before_new_columns
from expected_state.refusals import store_refusal
from reconcile.core import hooks
from reconcile.core.contract import RetryableError
from reconcile.core.schema_change import REBUILD, SchemaChange, SchemaChangeRefused

__all__ = ["SCHEMA_COMMITTED", "Evolving"]

# After the store committed a new schema, before the epoch's own commit.
SCHEMA_COMMITTED = hooks.declare("expected_state.schema_committed")


class Evolving:
    """Mixin for :class:`~expected_state.store.ExpectedStateStore`: schema evolution."""

    uri: str
    key_columns: list[str]
    generation: int
    _schema: pa.Schema | None
    _fence: str
    _evolving: SchemaChange | None = None

    def _delta(self, *, refresh: bool = True) -> DeltaTable | None:  # provided by the store
        raise NotImplementedError

    def current_schema(self) -> pa.Schema | None:
        """The user schema as this writer knows it (the log is not read again if known)."""
        if self._schema is None:
            self._delta(refresh=False)
        return self._schema

    def evolve(self, change: SchemaChange) -> None:
        """Take ``change.after`` as the schema of the epoch being staged.

        Raises:
            SchemaChangeRefused: a column whose Arrow type would change (the
                store has no type widening), naming it; nothing was written.
        """
        for name in change.widened:
            old, new = change.before.field(name).type, change.after.field(name).type
            if not old.equals(new):
                raise SchemaChangeRefused(
                    f"table {self.uri!r}: column {name!r} would widen from {old} to {new} in "
                    "the expected-state store, which cannot retype a column in place "
                    "(delta-rs has no type widening, and the row hash of every stored row "
                    f"depends on the type): {REBUILD}; nothing was written",
                    table=self.uri,
                    column=name,
                )
        check_column_names(change.after.names, table=self.uri)
        before = self._schema
        assert before is not None
        fields = [before.field(n) if before.get_field_index(n) >= 0 else None
                  for n in change.after.names]  # fmt: skip
        self._schema = pa.schema(
            [
                kept if kept is not None else change.after.field(i).remove_metadata()
                for i, kept in enumerate(fields)
            ]
        )
        self._evolving = change

    def abandon_evolution(self) -> None:
        """The staged epoch was aborted: the table's own schema again (read back)."""
        if self._evolving is None:
            return
        self._evolving = None
        table = self._delta()
        if table is not None:
            self._schema = user_schema_of(pa.schema(table.schema().to_arrow()))

    def _commit_new_columns(self, table: DeltaTable, epoch: int) -> DeltaTable:
        """Commit the evolving schema's new columns (fenced) if the table lacks them.

        Returns the table at its newest version, on which the epoch's own
        commit is then based (its order and fence are decided there again).

        Raises:
            FencedError: a newer generation has taken over; nothing was written.
            RetryableError: the commit lost to a concurrent one; nothing was written.
        """
        change, self._evolving = self._evolving, None
        if change is None:
            return table
        have = pa.schema(table.schema().to_arrow())
        missing = [n for n in change.added if have.get_field_index(n) < 0]
        if not missing:
            return table  # a replay after a crash between the two commits
        assert self._schema is not None
        marked = {n: self._schema.field(n).with_metadata({ADDED_EPOCH: str(epoch).encode()})
                  for n in missing}  # fmt: skip
        user = pa.schema([marked.get(f.name, f) for f in self._schema])
        stored = stored_schema(user, self.key_columns)
        # Fenced on the snapshot the merge is based on: a zombie that lost the
        # table since never adds a column.
        check_generation(table, self._fence, self.generation, table_name=self.uri)
        metadata: dict[str, Any] = {
            # The engine's own commit, as the log audit (expected_state.integrity) tells.
            "reconcile.app_id": self._fence,
            "reconcile.epoch": epoch,
            "reconcile.generation": self.generation,
            "reconcile.added_columns": ",".join(missing),
        }
        base = table.version()
        try:
            # Columns that need table features raise the protocol in a commit of
            # their own first, `invariants` listed (expected_state.protocol).
            if before_new_columns(
                table,
                pa.schema([marked[n] for n in missing]),
                {k: str(v) for k, v in metadata.items()},
            ):
                table.update_incremental()
            write_deltalake(
                table,
                stored.empty_table(),
                mode="append",
                schema_mode="merge",
                commit_properties=CommitProperties(
                    custom_metadata={k: str(v) for k, v in metadata.items()},
                    app_transactions=[Transaction(app_id=self._fence, version=self.generation)],
                ),
            )
        except Exception as exc:
            refused = store_refusal(exc, table=self.uri, what=f"new columns {missing}")
            if refused is not None:
                raise refused from None  # a schema it cannot take: no retry takes it either
            if not isinstance(exc, CommitFailedError | DeltaError):
                raise
            raise RetryableError(
                f"table {self.uri!r}: adding columns {missing} for epoch {epoch} lost to a "
                f"concurrent commit ({exc}); nothing was written",
                table=self.uri,
                epoch=epoch,
            ) from exc
        table.update_incremental()
        make_durable(self.uri, base + 1, table.version())
        self._schema = user
        hooks.point(SCHEMA_COMMITTED)
        return table
