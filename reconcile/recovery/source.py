"""The expected side of a diff: the store's rows at the target epoch, read lazily, by scope."""

from __future__ import annotations

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
import pyarrow.compute as pc  # type: ignore[import-untyped, unused-ignore]

from reconcile.core.contract import InvalidInputError, StoreIntegrityError
from reconcile.core.expected import ExpectedStore
from reconcile.recovery.diff import HASH

__all__ = ["ExpectedSource", "semi"]

# The store's change-kind column (upsert or delete).
OP = "_op"


class ExpectedSource:
    """The expected state of one table at the target epoch, read lazily from the store.

    Args:
        store: the store table (``reconcile.core.expected.ExpectedStore``).

    Raises:
        InvalidInputError: the store holds no epoch of the table (no schema yet).
    """

    def __init__(self, store: ExpectedStore, *, values: bool = False) -> None:
        self.store = store
        schema = store.user_schema
        if schema is None:
            raise InvalidInputError(f"table {store.uri!r}: the store holds no epoch of it")
        self.schema: pa.Schema = schema
        # A repair needs the expected values of the keys it writes: read them in
        # the same pass as the hashes (one read of the store, not two).
        self.values = values
        self._full: dict[int, pa.Table] = {}

    def rows(self, epoch: int) -> pa.Table:
        """Keys, values and ``_row_hash`` of every expected row at ``epoch``."""
        if epoch not in self._full:
            names = [*self.schema.names, HASH]
            self._full[epoch] = self.store.snapshot(epoch, columns=names)
        return self._full[epoch]

    def hashes(self, epoch: int, keys: list[str]) -> pa.Table:
        """Keys and ``_row_hash`` at ``epoch`` (the full rows if already read)."""
        if self.values:
            self.rows(epoch)
        if epoch in self._full:
            return self._full[epoch].select([*keys, HASH])
        table: pa.Table = self.store.snapshot(epoch, columns=[*keys, HASH])
        return table

    def of_keys(self, epoch: int, keys: list[str], scope: pa.Table, since: int) -> pa.Table:
        """The expected rows of the keys in ``scope`` only, with values if a repair needs them.

        Scoped recovery's read, at a cost that follows the scope: a key changed
        in epochs ``(since, epoch]`` is at its newest change there, read from
        the change files only; only the other keys of the scope (sink rows of
        later epochs the store did not change: a run that was reverted) are
        looked up in a snapshot, which reads the base.
        """
        names = [*self.schema.names, HASH] if self.values else [*keys, HASH]
        try:
            newest = self.store.newest_changes(since, epoch, names)
        except StoreIntegrityError:
            raise  # damage is reported, never read around
        except InvalidInputError:
            # The change files after `since` are no longer all there (vacuum): the
            # snapshot of the scope, which time-travels, is still right.
            return self._snapshot_of(epoch, names, scope)
        scope_keys = scope.select(keys).cast(newest.select(keys).schema)
        newest = semi(newest, scope_keys, keys)
        rest = scope_keys.join(newest.select(keys), keys=keys, join_type="left anti")
        upserts = newest.filter(pc.equal(newest.column(OP), "upsert")).select(names)
        if rest.num_rows == 0:
            return upserts
        return pa.concat_tables([upserts, self._snapshot_of(epoch, names, rest)])

    def _snapshot_of(self, epoch: int, names: list[str], scope: pa.Table) -> pa.Table:
        table: pa.Table = self.store.snapshot(epoch, columns=names, keys=scope)
        return table


def semi(table: pa.Table, keys_table: pa.Table, keys: list[str]) -> pa.Table:
    """Rows of ``table`` whose key is in ``keys_table``."""
    if keys_table.num_rows == 0 or table.num_rows == 0:
        return table.slice(0, 0)
    wanted = keys_table.select(keys).cast(table.select(keys).schema)
    return table.join(wanted.group_by(keys).aggregate([]), keys=keys, join_type="left semi")
