"""Who last wrote some rows of a Postgres sink table: the xid, its commit time, ours or not.

Asked after a diff, for a few differing rows only, in the pull's own
REPEATABLE READ snapshot: one query by key, never part of the bulk pull.

A row's ``xmin`` is the 32-bit xid of the transaction that last wrote it
(inserted it, or the newest version of it an UPDATE made). The engine records
its transactions as 64-bit ``xid8`` values, in its markers (``reconcile_commits``)
and its repairs (``reconcile_repairs``). The two are compared epoch-safely: the
row's full xid is rebuilt from its low 32 bits as the newest xid8 at or below
the snapshot's horizon with those bits, which is exact for every row VACUUM
has not frozen (Postgres keeps every unfrozen xid within 2^31 of the next one);
a frozen row (its ``xmin`` older than the table's ``relfrozenxid``) has no xid
that can be rebuilt, and is reported as too old to tell. The rebuilt xid is
then compared whole, all 64 bits, with the recorded ones: a marker written
2^32 transactions earlier, whose low bits are the same, does not match.

The commit time is ``pg_xact_commit_timestamp(xmin)``, where the server tracks
commit timestamps (``track_commit_timestamp``); off, the time is NULL and the
caller says why.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
from psycopg import sql

from reconcile.core.target import WRITER_COLUMNS

from .markers import MARKERS_TABLE, REPAIRS_TABLE

if TYPE_CHECKING:
    from .pull import PgSnapshot

__all__ = ["STAGED_KEYS", "WRITER_COLUMNS", "row_writers", "stage_keys"]

# The temporary table (pg_temp, the session's own) that keys are staged in.
STAGED_KEYS = "_reconcile_scope_keys"
# The columns ``row_writers`` adds to the pulled ones.
XID, COMMITTED_AT, ENGINE, BEFORE = WRITER_COLUMNS
# The low 32 bits of an xid8: what a row's xmin holds.
_LOW32 = 0xFFFFFFFF


def stage_keys(snap: PgSnapshot, keys: pa.Table) -> sql.Composable:
    """COPY ``keys`` into the session's temporary key table; the join condition on alias ``k``.

    The staged keys have the expected state's types (a uuid kept as text,
    say): the condition casts them to the column's own type, so that the key's
    index serves the join.
    """
    cur = snap._conn.cursor()
    staged = keys.select(snap.keys)
    snap._statements.run(
        lambda: cur.adbc_ingest(STAGED_KEYS, staged, mode="replace", temporary=True),
        cur.adbc_cancel,
    )
    snap.run(f"ANALYZE pg_temp.{STAGED_KEYS}")
    return sql.SQL(" AND ").join(
        sql.SQL("t.{0} = k.{0}::{1}").format(
            sql.Identifier(k), sql.SQL(snap.table.columns[k].sql_type)
        )
        for k in snap.keys
    )


# A row's rebuilt xid against one the engine recorded: all 64 bits, so that a
# recorded xid 2^32 transactions older, with the same low 32 bits, is another.
_SAME_XID = "x.xid = w.full_xid::text::pg_catalog.xid8"


def _recorded(schema: str, table: str) -> sql.Composable:
    """The rebuilt xids of ``w`` that a row of ``schema.table`` (markers or repairs) records."""
    return sql.SQL(
        "SELECT w.full_xid FROM w JOIN {} AS x ON x.pipeline = $1 AND x.sink = $2 AND {} "
        "WHERE w.rebuilt"
    ).format(sql.Identifier(schema, table), sql.SQL(_SAME_XID))


def _exists(snap: PgSnapshot, schema: str, table: str) -> bool:
    row = snap.run(
        "SELECT 1 FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n "
        "ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relname = $2",
        (schema, table),
    ).fetchone()
    return row is not None


def commit_times_tracked(snap: PgSnapshot) -> bool:
    """Whether the server records commit timestamps (``track_commit_timestamp``)."""
    row = snap.run("SELECT pg_catalog.current_setting('track_commit_timestamp')").fetchone()
    return str(row[0]).lower() in ("on", "true", "1", "yes")


def row_writers(snap: PgSnapshot, keys: pa.Table) -> tuple[pa.Table | None, bool, str]:
    """The sink's rows of ``keys`` with their last writer: (rows, commit times tracked, problem).

    Provenance never fails a verify for want of a privilege: a role without
    TEMP on the database, or without SELECT on the engine's markers or
    repairs, gets the problem (rows None), which the report states.

    Args:
        snap: the open snapshot the diff was made from.
        keys: the key columns of the rows to trace (a few: the caller bounds them).

    Returns:
        The rows the sink holds of those keys (a key it lacks has none), with
        the pull's columns plus ``_writer_xid`` (the full xid as text; NULL for
        a frozen row), ``_writer_committed_at`` (NULL when not tracked or not
        recorded), ``_writer_engine`` (a marker or a repair of this
        pipeline and sink carries exactly that xid) and
        ``_writer_before_epoch`` (the epoch of the sink's oldest kept marker,
        when the row's xid is older than that marker's: its writer's marker
        may have been pruned); whether the server tracks commit timestamps;
        and "" or why the session cannot trace rows.
    """
    problem = _cannot(snap)
    if problem:
        return None, False, problem
    return (*_row_writers(snap, keys), "")


def _cannot(snap: PgSnapshot) -> str:
    """Why this session cannot trace rows ("" if it can), asked before any statement fails.

    A failed statement would end the pull's transaction (the driver refuses
    even a rollback to a savepoint after it), and with it the verify.
    """
    row = snap.run(
        "SELECT pg_catalog.has_database_privilege(pg_catalog.current_database(), 'TEMP')"
    ).fetchone()
    if not row[0]:
        return (
            "the role may not create temporary tables in this database (TEMP), where the "
            "traced keys are staged"
        )
    schema = snap.markers.schema
    for name in (MARKERS_TABLE, REPAIRS_TABLE):
        if schema is None or not _exists(snap, schema, name):
            continue
        row = snap.run(
            "SELECT pg_catalog.has_table_privilege($1, 'SELECT')",
            (snap._text(sql.Identifier(schema, name)),),
        ).fetchone()
        if not row[0]:
            return f"the role may not read {schema}.{name} (SELECT), which names the engine's xids"
    return ""


def _row_writers(snap: PgSnapshot, keys: pa.Table) -> tuple[pa.Table, bool]:
    tracked = commit_times_tracked(snap)
    match = stage_keys(snap, keys)
    markers = snap.markers
    recorded: list[sql.Composable] = []
    oldest: sql.Composable = sql.SQL(
        "SELECT NULL::bigint AS xid, NULL::bigint AS epoch WHERE false"
    )
    if markers.schema is not None:
        if _exists(snap, markers.schema, MARKERS_TABLE):
            # Through the markers' key (pipeline, sink, epoch): one index probe.
            # Epochs commit in order, each txn begun after the one before
            # committed, so the oldest epoch's xid is the oldest kept.
            oldest = sql.SQL(
                "SELECT m.xid::text::bigint AS xid, m.epoch FROM {} AS m "
                "WHERE m.pipeline = $1 AND m.sink = $2 ORDER BY m.epoch LIMIT 1"
            ).format(sql.Identifier(markers.schema, MARKERS_TABLE))
        recorded = [
            _recorded(markers.schema, name)
            for name in (MARKERS_TABLE, REPAIRS_TABLE)
            if _exists(snap, markers.schema, name)
        ]
    ours = (
        sql.SQL(" UNION ").join(recorded)
        if recorded
        else sql.SQL("SELECT NULL::bigint AS full_xid WHERE $1::text IS NULL AND $2::text IS NULL")
    )
    # Only a rebuilt xid has a commit time worth reading: a frozen row's xmin
    # may name a transaction whose status the server no longer keeps.
    committed = (
        sql.SQL("CASE WHEN w.rebuilt THEN pg_catalog.pg_xact_commit_timestamp(w.raw_xmin) END")
        if tracked
        else sql.SQL("NULL::timestamptz")
    )
    query = sql.SQL(
        "WITH h AS ("
        # The newest xid the snapshot could see: every visible row's xmin is below it.
        " SELECT pg_catalog.pg_snapshot_xmax(pg_catalog.pg_current_snapshot())::text::bigint - 1"
        " AS top, pg_catalog.age(c.relfrozenxid) AS frozen_age"
        " FROM pg_catalog.pg_class c WHERE c.oid = $3::pg_catalog.regclass),"
        " w AS (SELECT {cols}, t.xmin AS raw_xmin,"
        # The newest xid8 at or below the horizon whose low 32 bits are the row's xmin.
        " h.top - ((h.top - t.xmin::text::bigint) & {low}) AS full_xid,"
        # Older than relfrozenxid: frozen, its xid can no longer be rebuilt.
        " pg_catalog.age(t.xmin) <= h.frozen_age AS rebuilt"
        " FROM {table} AS t JOIN {staged} AS k ON {match} CROSS JOIN h),"
        " ours AS ({ours}), oldest AS ({oldest})"
        " SELECT {names}, CASE WHEN w.rebuilt THEN w.full_xid::text END AS {xid},"
        " {committed} AS {at},"
        " (w.rebuilt AND w.full_xid IN (SELECT full_xid FROM ours)) AS {engine},"
        " (SELECT o.epoch FROM oldest o WHERE w.rebuilt AND w.full_xid < o.xid) AS {before}"
        " FROM w"
    ).format(
        cols=snap._select_list(),
        low=sql.Literal(_LOW32),
        table=snap.table.ident,
        staged=sql.Identifier("pg_temp", STAGED_KEYS),
        match=match,
        ours=ours,
        oldest=oldest,
        before=sql.Identifier(BEFORE),
        names=sql.SQL(", ").join(sql.Identifier("w", f.name) for f in snap.schema),
        xid=sql.Identifier(XID),
        committed=committed,
        at=sql.Identifier(COMMITTED_AT),
        engine=sql.Identifier(ENGINE),
    )
    table_name = snap._text(snap.table.ident)
    return snap._fetch(query, (markers.pipeline, markers.sink, table_name)), tracked
