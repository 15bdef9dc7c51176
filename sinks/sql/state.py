"""The generic SQL sink's own tables, through SQLAlchemy Core: markers, fences, repairs.

The same three facts as the Postgres sink's tables, in any database SQLAlchemy
speaks, under their own names (``reconcile_sql_*``) so that both sinks can share
a database: a marker per committed epoch (written in the epoch's transaction),
the newest writer generation per (pipeline, sink), and one row per repair.
There is no transaction id to record: an ambiguous COMMIT is settled by the
marker (or the repair's row) alone. A marker is believed only as far as the
store decided (:func:`untrusted_marker`, ``reconcile.core.claims``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from reconcile.core.claims import Claim, check_claim
from reconcile.core.contract import Fatal, WriterIdentity
from sinks.objects.sql_state import SQL_MARKERS, sql_state_tables

__all__ = ["SqlMarker", "SqlState", "untrusted_marker"]


@dataclass(frozen=True)
class SqlMarker:
    """A committed epoch: where it was written and by which progress log."""

    epoch: int
    target_table: str
    log_id: str | None
    generation: int


class SqlState:
    """The three state tables in one schema (None: the connection's default)."""

    def __init__(self, schema: str | None) -> None:
        # Declared with every other object the engine creates (sinks.objects).
        self.metadata, self.markers, self.fences, self.repairs = sql_state_tables(schema)

    def exists(self, conn: sa.Connection) -> bool:
        """Whether the marker table exists (a verify creates nothing)."""
        return sa.inspect(conn).has_table(SQL_MARKERS, schema=self.metadata.schema)

    def find_marker(
        self, conn: sa.Connection, pipeline: str, sink: str, epoch: int
    ) -> SqlMarker | None:
        m = self.markers.c
        row = conn.execute(
            sa.select(m.epoch, m.target_table, m.log_id, m.generation).where(
                m.pipeline == pipeline, m.sink == sink, m.epoch == epoch
            )
        ).first()
        return None if row is None else SqlMarker(int(row[0]), str(row[1]), row[2], int(row[3]))

    def newest(self, conn: sa.Connection, pipeline: str, sink: str) -> int | None:
        m = self.markers.c
        value = conn.execute(
            sa.select(sa.func.max(m.epoch)).where(m.pipeline == pipeline, m.sink == sink)
        ).scalar()
        return None if value is None else int(value)

    def fence(self, conn: sa.Connection, pipeline: str, sink: str) -> tuple[int, str | None] | None:
        f = self.fences.c
        row = conn.execute(
            sa.select(f.generation, f.log_id).where(f.pipeline == pipeline, f.sink == sink)
        ).first()
        return None if row is None else (int(row[0]), row[1])

    def lock_fence(
        self, conn: sa.Connection, pipeline: str, sink: str, generation: int | None
    ) -> tuple[int, str | None] | None:
        """Lock the fence row inside the caller's transaction; raise it to ``generation``.

        An UPDATE (rather than SELECT ... FOR UPDATE, which not every database
        has) takes the row's write lock everywhere (in SQLite, the database's):
        from here until the transaction ends no other writer of the sink can
        commit. Returns the fence after, or None if there is no fence row.
        """
        f = self.fences.c
        where = [f.pipeline == pipeline, f.sink == sink]
        values: dict[str, Any] = {"generation": f.generation}
        if generation is not None:
            values = {
                "generation": sa.case((f.generation < generation, generation), else_=f.generation)
            }
        conn.execute(self.fences.update().where(*where).values(**values))
        return self.fence(conn, pipeline, sink)

    def claim(
        self, conn: sa.Connection, pipeline: str, sink: str, log_id: str | None
    ) -> tuple[int, str | None]:
        """Create the fence row if missing (the first writer's log id); return it."""
        found = self.fence(conn, pipeline, sink)
        if found is None:
            try:
                with conn.begin_nested():
                    conn.execute(
                        self.fences.insert().values(
                            pipeline=pipeline, sink=sink, generation=0, log_id=log_id
                        )
                    )
            except sa.exc.IntegrityError:
                pass  # created meanwhile by another writer
            found = self.fence(conn, pipeline, sink)
        assert found is not None
        return found


def untrusted_marker(
    sink: str, state: SqlState, marker: SqlMarker, writer: WriterIdentity | None
) -> Fatal | None:
    """None if the store's decisions back this writer's ``marker``; else the Fatal refusing it.

    A marker row claims its epoch, by its generation: trusted only for an
    epoch the store decided and a generation it granted (an
    UntrustedRecordError otherwise, counted and logged). An unbound sink has
    no store to ask.
    """
    claim = Claim(
        sink=sink,
        what=f"sql sink {sink!r}",
        record=f"the marker of epoch {marker.epoch} in table {state.markers.fullname}",
        kind="commit",
        epoch=marker.epoch,
        generation=marker.generation,
    )
    refused = check_claim(claim, None if writer is None else writer.decisions)
    return None if refused is None else Fatal.of(refused)
