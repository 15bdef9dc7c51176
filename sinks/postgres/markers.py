"""The sink's own tables in use: markers, fences, repairs (declared in sinks.objects)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql

from sinks.objects.declared import FENCES, MARKERS, REPAIRS, STATE_TABLES
from sinks.objects.postgres import create_tables

__all__ = [
    "FENCES_TABLE",
    "MARKERS_TABLE",
    "REPAIRS_TABLE",
    "EpochStart",
    "Fence",
    "Marker",
    "StateTables",
]

# The tables are declared (DDL, expected definition) with every other object
# the engine creates, in sinks.objects; here is how they are used.
MARKERS_TABLE = MARKERS.name
FENCES_TABLE = FENCES.name
REPAIRS_TABLE = REPAIRS.name

# The durability level of every epoch txn: a role or database default of
# 'off' (or 'local') would let an acknowledged epoch vanish in a server crash
# (or a failover); a stricter level that is configured is kept.
SYNC_COMMIT_AT_LEAST_ON = (
    "set_config('synchronous_commit', CASE WHEN current_setting('synchronous_commit') "
    "IN ('remote_write', 'on', 'remote_apply') THEN current_setting('synchronous_commit') "
    "ELSE 'on' END, {local})"
)

_MARKER_COLUMNS = (
    "m.pipeline, m.sink, m.epoch, m.target_schema, m.target_table, m.log_id, "
    "m.xid::text, m.backend_pid, m.generation, m.committed_at"
)


@dataclass(frozen=True)
class Marker:
    """A committed epoch, as recorded by its marker row: what, where, and by whom."""

    pipeline: str
    sink: str
    epoch: int
    target_schema: str
    target_table: str
    log_id: str | None
    xid: str
    backend_pid: int
    generation: int
    committed_at: datetime | None = None

    @property
    def target(self) -> str:
        """The table it was written for, as ``schema.table``."""
        return f"{self.target_schema}.{self.target_table}"

    @classmethod
    def from_row(cls, row: tuple[Any, ...]) -> Marker:
        """Build from the columns of ``_MARKER_COLUMNS``, in that order."""
        return cls(
            str(row[0]),
            str(row[1]),
            int(row[2]),
            str(row[3]),
            str(row[4]),
            None if row[5] is None else str(row[5]),
            str(row[6]),
            int(row[7]),
            int(row[8]),
            row[9],
        )


@dataclass(frozen=True)
class Fence:
    """A (pipeline, sink)'s fence row: the newest writer generation and its progress log."""

    generation: int
    log_id: str | None
    updated_at: datetime | None = None


@dataclass(frozen=True)
class EpochStart:
    """What the first statement of an epoch transaction learned."""

    xid: str  # pg_current_xact_id(), as text (xid8)
    fence: Fence | None  # None: the fence row is missing
    marker: Marker | None  # the epoch is already committed (by someone) if set

    @property
    def fence_generation(self) -> int | None:
        return None if self.fence is None else self.fence.generation


class StateTables:
    """SQL for the marker and fence tables of one schema."""

    def __init__(self, schema: str) -> None:
        self.schema = schema
        self.markers = sql.Identifier(schema, MARKERS_TABLE)
        self.fences = sql.Identifier(schema, FENCES_TABLE)
        self.repairs = sql.Identifier(schema, REPAIRS_TABLE)

    def display(self, table: str = MARKERS_TABLE) -> str:
        """``schema.table`` of one of the two tables, quoted as SQL wants it."""
        return sql.Identifier(self.schema, table).as_string(None)

    def create(self, conn: psycopg.Connection[Any], tables: tuple[str, ...] | None = None) -> None:
        """Create the tables (default: all) if missing (autocommit), unchecked.

        The sink's start-up goes through ``sinks.objects.postgres.open_state_schema``,
        which creates and checks them.
        """
        chosen = [t for t in STATE_TABLES if tables is None or t.name in tables]
        create_tables(conn, self.schema, chosen)

    def ensure(
        self, conn: psycopg.Connection[Any], pipeline: str, sink: str, log_id: str | None
    ) -> Fence:
        """Create the fence row of (pipeline, sink) if missing (autocommit); return it.

        The fence row is created here, outside any epoch transaction, so that
        two open epoch transactions never wait on each other's insert of it.
        The row records the progress log that claimed it first: the caller
        compares it with its own (see ownership.py).
        """
        # NOT EXISTS first: a bare ON CONFLICT would wait for a writer that is
        # updating the row inside an open or prepared epoch txn.
        conn.execute(
            sql.SQL(
                "INSERT INTO {0} (pipeline, sink, generation, log_id) "
                "SELECT %(p)s, %(s)s, 0, %(l)s "
                "WHERE NOT EXISTS (SELECT 1 FROM {0} WHERE pipeline = %(p)s AND sink = %(s)s) "
                "ON CONFLICT (pipeline, sink) DO NOTHING"
            ).format(self.fences),
            {"p": pipeline, "s": sink, "l": log_id},
        )
        fence = self.find_fence(conn, pipeline, sink)
        assert fence is not None
        return fence

    def find_fence(self, conn: psycopg.Connection[Any], pipeline: str, sink: str) -> Fence | None:
        """The fence row of (pipeline, sink), or None."""
        row = conn.execute(
            sql.SQL(
                "SELECT generation, log_id, updated_at FROM {} WHERE pipeline = %s AND sink = %s"
            ).format(self.fences),
            (pipeline, sink),
        ).fetchone()
        return None if row is None else Fence(int(row[0]), row[1], row[2])

    def start_epoch(
        self, cur: psycopg.Cursor[Any], pipeline: str, sink: str, epoch: int, *, share: bool
    ) -> EpochStart:
        """First statement of an epoch txn: xid, durability, fence (row locked), marker.

        ``share`` locks the fence row FOR SHARE instead of FOR UPDATE, so that
        several prepared transactions of one generation can coexist; a takeover
        (UPDATE) still waits for all of them. The same statement raises this
        transaction's ``synchronous_commit`` to at least 'on'.
        """
        # NOWAIT: a locked fence row means another writer of this sink has an
        # epoch txn open (a zombie, or a takeover in progress); waiting could
        # last forever, so fail at once with LockNotAvailable (retryable).
        lock = sql.SQL("FOR SHARE NOWAIT" if share else "FOR UPDATE NOWAIT")
        query = sql.SQL(
            "WITH fence AS (SELECT generation, log_id, updated_at FROM {fences} "
            " WHERE pipeline = %(p)s AND sink = %(s)s {lock}) "
            "SELECT pg_current_xact_id()::text, {durable}, "
            " f.generation, f.log_id, f.updated_at, {columns} "
            "FROM (SELECT 1) one LEFT JOIN fence f ON true LEFT JOIN {markers} m "
            " ON m.pipeline = %(p)s AND m.sink = %(s)s AND m.epoch = %(e)s"
        ).format(
            fences=self.fences,
            markers=self.markers,
            lock=lock,
            durable=sql.SQL(SYNC_COMMIT_AT_LEAST_ON.format(local="true")),
            columns=sql.SQL(_MARKER_COLUMNS),
        )
        row = cur.execute(query, {"p": pipeline, "s": sink, "e": epoch}).fetchone()
        assert row is not None
        fence = None if row[2] is None else Fence(int(row[2]), row[3], row[4])
        marker = Marker.from_row(row[5:]) if row[5] is not None else None
        return EpochStart(xid=row[0], fence=fence, marker=marker)

    def raise_fence(
        self,
        cur: psycopg.Cursor[Any],
        pipeline: str,
        sink: str,
        generation: int,
        log_id: str | None,
    ) -> Fence | None:
        """Set the fence to ``generation`` unless it is higher; return the fence after.

        Inside an epoch txn this is the takeover by a newer writer: the UPDATE
        waits for every txn that holds the row locked (an older writer's open or
        prepared epoch) and then re-checks the condition on the latest version.
        A fence row of another progress log is never taken over (the caller
        reports it as a MarkerMismatchError).
        """
        row = cur.execute(
            sql.SQL(
                "INSERT INTO {} AS f (pipeline, sink, generation, log_id) "
                "VALUES (%(p)s, %(s)s, %(g)s, %(l)s) "
                "ON CONFLICT (pipeline, sink) DO UPDATE SET generation = EXCLUDED.generation, "
                "updated_at = now() WHERE f.generation < EXCLUDED.generation "
                "AND f.log_id IS NOT DISTINCT FROM EXCLUDED.log_id "
                "RETURNING generation, log_id, updated_at"
            ).format(self.fences),
            {"p": pipeline, "s": sink, "g": generation, "l": log_id},
        ).fetchone()
        if row is not None:
            return Fence(int(row[0]), row[1], row[2])
        current = cur.execute(
            sql.SQL(
                "SELECT generation, log_id, updated_at FROM {} WHERE pipeline = %s AND sink = %s"
            ).format(self.fences),
            (pipeline, sink),
        ).fetchone()
        return None if current is None else Fence(int(current[0]), current[1], current[2])

    def insert_marker(
        self,
        cur: psycopg.Cursor[Any],
        txn: tuple[str, str, int],
        target: tuple[str, str],
        log_id: str | None,
        generation: int,
        row_count: int,
    ) -> None:
        """Write the marker in the epoch's own txn: it commits exactly when the data does.

        A plain INSERT: a marker that exists already (another writer committed
        the epoch meanwhile) must fail with a unique violation, never be skipped.
        """
        cur.execute(
            sql.SQL(
                "INSERT INTO {} (pipeline, sink, epoch, target_schema, target_table, log_id, "
                "xid, backend_pid, generation, row_count) "
                "VALUES (%s, %s, %s, %s, %s, %s, pg_current_xact_id(), pg_backend_pid(), %s, %s)"
            ).format(self.markers),
            (*txn, *target, log_id, generation, row_count),
        )

    def find_marker(
        self, conn: psycopg.Connection[Any], pipeline: str, sink: str, epoch: int
    ) -> Marker | None:
        """The committed marker of an epoch, or None."""
        row = conn.execute(
            sql.SQL(
                "SELECT " + _MARKER_COLUMNS + " FROM {} m "
                "WHERE m.pipeline = %s AND m.sink = %s AND m.epoch = %s"
            ).format(self.markers),
            (pipeline, sink, epoch),
        ).fetchone()
        return None if row is None else Marker.from_row(row)

    def edge_markers(
        self, conn: psycopg.Connection[Any], pipeline: str, sink: str
    ) -> tuple[Marker | None, Marker | None]:
        """The oldest and the newest marker of (pipeline, sink): two index probes."""
        found: list[Marker | None] = []
        for order in ("ASC", "DESC"):
            row = conn.execute(
                sql.SQL(
                    "SELECT " + _MARKER_COLUMNS + " FROM {} m "
                    "WHERE m.pipeline = %s AND m.sink = %s ORDER BY m.epoch " + order + " LIMIT 1"
                ).format(self.markers),
                (pipeline, sink),
            ).fetchone()
            found.append(None if row is None else Marker.from_row(row))
        return found[0], found[1]
