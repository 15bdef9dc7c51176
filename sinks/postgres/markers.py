"""The sink's own tables: commit markers (reconcile_commits) and writer fences."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import errors, sql

__all__ = [
    "FENCES_TABLE",
    "MARKERS_TABLE",
    "EpochStart",
    "Marker",
    "StateTables",
]

MARKERS_TABLE = "reconcile_commits"
FENCES_TABLE = "reconcile_fences"

_CREATE_MARKERS = """
CREATE TABLE IF NOT EXISTS {markers} (
    pipeline     text        NOT NULL,
    sink         text        NOT NULL,
    epoch        bigint      NOT NULL,
    xid          xid8        NOT NULL,
    backend_pid  integer     NOT NULL,
    generation   bigint      NOT NULL,
    row_count    bigint      NOT NULL,
    committed_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (pipeline, sink, epoch)
)"""

_CREATE_FENCES = """
CREATE TABLE IF NOT EXISTS {fences} (
    pipeline   text        NOT NULL,
    sink       text        NOT NULL,
    generation bigint      NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (pipeline, sink)
)"""


@dataclass(frozen=True)
class Marker:
    """A committed epoch, as recorded by its marker row."""

    epoch: int
    xid: str
    backend_pid: int
    generation: int


@dataclass(frozen=True)
class EpochStart:
    """What the first statement of an epoch transaction learned."""

    xid: str  # pg_current_xact_id(), as text (xid8)
    fence_generation: int | None  # None: the fence row is missing
    marker: Marker | None  # the epoch is already committed if set


class StateTables:
    """SQL for the marker and fence tables of one schema."""

    def __init__(self, schema: str) -> None:
        self.schema = schema
        self.markers = sql.Identifier(schema, MARKERS_TABLE)
        self.fences = sql.Identifier(schema, FENCES_TABLE)

    def create(self, conn: psycopg.Connection[Any]) -> None:
        """Create both tables if missing (autocommit)."""
        for statement in (_CREATE_MARKERS, _CREATE_FENCES):
            query = sql.SQL(statement).format(markers=self.markers, fences=self.fences)
            # Two sessions may run CREATE TABLE IF NOT EXISTS at once; the
            # loser gets a unique violation, and the table exists anyway.
            with contextlib.suppress(errors.UniqueViolation):
                conn.execute(query)

    def ensure(self, conn: psycopg.Connection[Any], pipeline: str, sink: str) -> None:
        """Create the fence row of (pipeline, sink) if missing (autocommit).

        The fence row is created here, outside any epoch transaction, so that
        two open epoch transactions never wait on each other's insert of it.
        """
        # NOT EXISTS first: a bare ON CONFLICT would wait for a writer that is
        # updating the row inside an open or prepared epoch txn.
        conn.execute(
            sql.SQL(
                "INSERT INTO {0} (pipeline, sink, generation) SELECT %(p)s, %(s)s, 0 "
                "WHERE NOT EXISTS (SELECT 1 FROM {0} WHERE pipeline = %(p)s AND sink = %(s)s) "
                "ON CONFLICT (pipeline, sink) DO NOTHING"
            ).format(self.fences),
            {"p": pipeline, "s": sink},
        )

    def start_epoch(
        self, cur: psycopg.Cursor[Any], pipeline: str, sink: str, epoch: int, *, share: bool
    ) -> EpochStart:
        """First statement of an epoch txn: xid, fence generation (row locked), marker.

        ``share`` locks the fence row FOR SHARE instead of FOR UPDATE, so that
        several prepared transactions of one generation can coexist; a takeover
        (UPDATE) still waits for all of them.
        """
        # NOWAIT: a locked fence row means another writer of this sink has an
        # epoch txn open (a zombie, or a takeover in progress); waiting could
        # last forever, so fail at once with LockNotAvailable (retryable).
        lock = sql.SQL("FOR SHARE NOWAIT" if share else "FOR UPDATE NOWAIT")
        query = sql.SQL(
            "WITH fence AS (SELECT generation FROM {fences} "
            " WHERE pipeline = %(p)s AND sink = %(s)s {lock}) "
            "SELECT pg_current_xact_id()::text, (SELECT generation FROM fence), "
            " m.epoch, m.xid::text, m.backend_pid, m.generation "
            "FROM (SELECT 1) one LEFT JOIN {markers} m "
            " ON m.pipeline = %(p)s AND m.sink = %(s)s AND m.epoch = %(e)s"
        ).format(fences=self.fences, markers=self.markers, lock=lock)
        row = cur.execute(query, {"p": pipeline, "s": sink, "e": epoch}).fetchone()
        assert row is not None
        marker = Marker(row[2], row[3], row[4], row[5]) if row[2] is not None else None
        return EpochStart(xid=row[0], fence_generation=row[1], marker=marker)

    def raise_fence(
        self, cur: psycopg.Cursor[Any], pipeline: str, sink: str, generation: int
    ) -> int | None:
        """Set the fence to ``generation`` unless it is higher; return the fence after.

        Inside an epoch txn this is the takeover by a newer writer: the UPDATE
        waits for every txn that holds the row locked (an older writer's open or
        prepared epoch) and then re-checks the condition on the latest version.
        """
        row = cur.execute(
            sql.SQL(
                "INSERT INTO {} AS f (pipeline, sink, generation) VALUES (%(p)s, %(s)s, %(g)s) "
                "ON CONFLICT (pipeline, sink) DO UPDATE SET generation = EXCLUDED.generation, "
                "updated_at = now() WHERE f.generation < EXCLUDED.generation "
                "RETURNING generation"
            ).format(self.fences),
            {"p": pipeline, "s": sink, "g": generation},
        ).fetchone()
        if row is not None:
            return int(row[0])
        current = cur.execute(
            sql.SQL("SELECT generation FROM {} WHERE pipeline = %s AND sink = %s").format(
                self.fences
            ),
            (pipeline, sink),
        ).fetchone()
        return None if current is None else int(current[0])

    def insert_marker(
        self,
        cur: psycopg.Cursor[Any],
        pipeline: str,
        sink: str,
        epoch: int,
        generation: int,
        row_count: int,
    ) -> None:
        """Write the marker in the epoch's own txn: it commits exactly when the data does."""
        cur.execute(
            sql.SQL(
                "INSERT INTO {} (pipeline, sink, epoch, xid, backend_pid, generation, row_count) "
                "VALUES (%s, %s, %s, pg_current_xact_id(), pg_backend_pid(), %s, %s)"
            ).format(self.markers),
            (pipeline, sink, epoch, generation, row_count),
        )

    def find_marker(
        self, conn: psycopg.Connection[Any], pipeline: str, sink: str, epoch: int
    ) -> Marker | None:
        """The committed marker of an epoch, or None."""
        row = conn.execute(
            sql.SQL(
                "SELECT epoch, xid::text, backend_pid, generation FROM {} "
                "WHERE pipeline = %s AND sink = %s AND epoch = %s"
            ).format(self.markers),
            (pipeline, sink, epoch),
        ).fetchone()
        return None if row is None else Marker(row[0], row[1], row[2], row[3])
