"""Schema evolution in a Postgres sink's epoch txn: the change handed, made, or forgotten.

The mixin of :class:`~sinks.postgres.epoch_txn.EpochTxnSink` that keeps the
change the commit cycle hands the sink (``evolve_schema``), makes it in the
epoch's txn after the fence check (``_evolve``, with ``evolution.py``), and
drops it when the epoch that brought it is aborted (``_forget_evolution``).
A change is kept until a txn finds nothing left to make: the txn that ran
the DDL may still roll back, and the next one then makes it again.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import psycopg
import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]

from reconcile.core.contract import RetryableError, SinkTxnId
from reconcile.core.schema_change import REBUILD, ForeignSchemaChange, SchemaChange, added_epoch
from sinks.open_txn import Key

from .client import PgSinkClient
from .evolution import evolve_in_txn, projected
from .schema import TableSchema, reflect_table

__all__ = ["SchemaEvolving"]


class SchemaEvolving(PgSinkClient):
    """The schema change a Postgres sink makes in its next epoch txn (mixin)."""

    def _init_evolution(self) -> None:
        # A schema change to make in the next epoch's txn (kept until a txn finds
        # nothing left to make: its DDL is committed).
        self._evolution: SchemaChange | None = None
        # The columns this client added, or took over, in an earlier txn of the
        # change: their values are the pipeline's, not someone else's.
        self._owned: set[str] = set()
        # The epoch whose txn ran the change's DDL (None: none has yet).
        self._evolved_in: Key | None = None

    def evolve_schema(self, change: SchemaChange) -> None:
        """Make ``change`` in the next epoch's txn, after its fence check (``evolution.py``).

        Checked now against the table as reflected, so that a change the table
        cannot take (a narrowing) stops the epoch before anything is written.

        Raises:
            SchemaChangeRefused: naming the table and the column; a column the
                store added in an epoch this sink holds, and which the table
                lacks (someone dropped it), is a ``ForeignSchemaChange``.
            RetryableError: the markers could not be read now.
        """
        kept = self._evolution
        if kept is not None and self._evolved_in is not None:
            # An earlier epoch's txn made the kept change, and committed it: an
            # epoch is staged only once the one before it is in, or aborted
            # (which forgets its change). The table as it is now, then.
            self._schema = self._reflect()
            self._evolution, self._evolved_in, kept = None, None, None
            self._owned.clear()
        if kept is not None:
            # A change not made yet (a column the store committed, handed at
            # start-up) and this epoch's: both in its txn.
            change = _merged(kept, change)
        projected(self.setup(), change)
        self._check_restored(change)
        self._evolution = change

    def _reflect(self) -> TableSchema:
        """The target as a new session reads it now."""
        schema = self.setup()
        try:
            with self.target.connect(autocommit=True, application_name=self.application_name) as c:
                return reflect_table(c, schema.schema, schema.table, schema.key)
        except psycopg.Error as err:
            raise RetryableError(
                self.target.redact(f"postgres sink {self._name!r}: reading its table: {err}")
            ) from None

    def _check_restored(self, change: SchemaChange) -> None:
        """Refuse to add back a store column the sink had: one an epoch it holds added.

        A column the store added (``added_epoch``) and the table lacks is
        added to it on restart (a crash between the store's commit and the
        sink's), unless the sink holds that epoch already: then the table had
        the column, and someone dropped it. Its rows would come back NULL.
        """
        since = {n: added_epoch(change.after.field(n)) for n in change.added}
        wanted = {n: e for n, e in since.items() if e is not None and n not in self.setup().columns}
        if not wanted or self.pipeline is None:
            return
        assert self._state is not None
        try:
            with self.target.connect(autocommit=True, application_name=self.application_name) as c:
                newest = self._state.edge_markers(c, self.pipeline, self._name)[1]
        except psycopg.Error as err:
            raise RetryableError(
                self.target.redact(f"postgres sink {self._name!r}: reading its markers: {err}")
            ) from None
        for name, epoch in wanted.items():
            if newest is not None and newest.epoch >= epoch:
                display = self.setup().display
                raise ForeignSchemaChange(
                    f"postgres sink {self._name!r}: table {display}: column {name!r} is missing, "
                    f"though the table holds epoch {newest.epoch} and epoch {epoch} added the "
                    "column to it: someone dropped it. The pipeline does not add it back with "
                    f"every row NULL: restore it with its values (then verify), or {REBUILD}; "
                    "nothing was written",
                    table=display,
                    column=name,
                    change="dropped",
                )

    def _evolve(
        self, conn: psycopg.Connection[Any], cur: psycopg.Cursor[Any], txn_id: SinkTxnId
    ) -> TableSchema:
        """Make the change in this txn; the table as the txn now reads it, to write into."""
        schema, change = self._schema, self._evolution
        assert schema is not None and change is not None
        now = reflect_table(conn, schema.schema, schema.table, schema.key)
        ran = evolve_in_txn(cur, now, change, self._owned)
        # Made or taken over here: if this txn rolls back, a column it added is
        # gone (and added again), and one it took over is checked again.
        self._owned.update(change.added)
        if not ran:
            # Nothing to make: an earlier epoch's txn made it and committed (or
            # the columns were there): the change is done, the reflection current.
            self._evolution, self._evolved_in = None, None
            self._owned.clear()
            self._schema = now
            return now
        self._evolved_in = txn_id.key
        return reflect_table(conn, schema.schema, schema.table, schema.key)

    def _forget_evolution(self, txn_id: SinkTxnId) -> None:
        """The epoch ``txn_id`` is aborted: drop what of the change came with it.

        The change came with that epoch (or its DDL rolled back with it): the
        store went back to its schema (``abandon_evolution``), and hands the
        change again if the epoch run again still asks for it. Kept, it would
        alter the table for an epoch that no longer carries the column. A
        change an earlier epoch's txn made stays until a txn finds it done, and
        so do the columns the store committed already (handed at start-up, they
        carry the epoch that added them): no epoch run again asks for them.
        """
        change = self._evolution
        if change is None or self._evolved_in not in (None, txn_id.key):
            return
        committed = tuple(n for n in change.added if added_epoch(change.after.field(n)) is not None)
        self._evolution = replace(change, added=committed, widened=()) if committed else None
        self._evolved_in = None
        self._owned.clear()


def _merged(kept: SchemaChange, change: SchemaChange) -> SchemaChange:
    """One change that makes both: the kept one's columns (its fields), then the new one's."""
    added = tuple(dict.fromkeys(kept.added + change.added))
    widened = tuple(n for n in dict.fromkeys(kept.widened + change.widened) if n not in added)
    fields = [kept.after.field(f.name) if f.name in kept.added else f for f in change.after]
    fields += [kept.after.field(n) for n in kept.added if change.after.get_field_index(n) < 0]
    after = pa.schema(fields)
    return SchemaChange(change.table, kept.before, after, added, widened)
