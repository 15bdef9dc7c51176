"""One repair of a table at a time through SQLAlchemy, as ``sinks.postgres.repair_turn`` does.

A second repair of a table waits for the first before it pulls, so that it
finds what the first left rather than applying the same difference again. The
turn is a named lock held by a connection of its own until the repair ends:

- MariaDB and MySQL: ``GET_LOCK('reconcile.repair.<digest of the table>')``;
- PostgreSQL: the same advisory lock the Postgres sink's repairs take (the
  table's oid, ``sinks.postgres.repair_turn.TURN_KEY_SPACE``), so that a
  repair through SQLAlchemy and one through the COPY path take turns too;
- other databases (SQLite: one writer per file): no turn.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress

import sqlalchemy as sa

from reconcile.core.contract import RetryableError
from reconcile.core.target import RepairTurn
from sinks.postgres.repair_turn import TURN_KEY_SPACE

__all__ = ["sql_repair_turn"]

log = logging.getLogger("reconcile.recovery")

_PG_KEY = sa.text(
    "SELECT (CAST(:space AS bigint) << 32) | CAST(c.oid AS bigint) FROM pg_catalog.pg_class c "
    "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
    "WHERE n.nspname = COALESCE(:schema, current_schema()) AND c.relname = :table"
)


def _take(conn: sa.Connection, schema: str | None, table: str, wait_s: float) -> RepairTurn:
    """Take the table's turn on ``conn`` (waiting up to ``wait_s``); raise if it stays taken."""
    dialect = conn.dialect.name
    if dialect == "postgresql":
        key = conn.execute(_PG_KEY, {"space": TURN_KEY_SPACE, "schema": schema,
                                     "table": table}).scalar_one()  # fmt: skip
        try_lock = sa.text("SELECT pg_catalog.pg_try_advisory_lock(:k)").bindparams(k=key)
        holder_query = sa.text(
            "SELECT pid FROM pg_catalog.pg_locks WHERE locktype = 'advisory' AND granted "
            "AND objsubid = 1 AND classid = CAST(CAST(:hi AS bigint) AS oid) "
            "AND objid = CAST(CAST(:lo AS bigint) AS oid)"
        ).bindparams(hi=key >> 32, lo=key & 0xFFFFFFFF)
        conn.exec_driver_sql(f"SET lock_timeout = {max(1, int(wait_s * 1000))}")
        wait = sa.text("SELECT pg_catalog.pg_advisory_lock(:k)").bindparams(k=key)
    else:
        name = (
            "reconcile.repair."
            + hashlib.sha256(f"{conn.engine.url.database}.{schema}.{table}".encode()).hexdigest()[
                :32
            ]
        )
        try_lock = sa.text("SELECT GET_LOCK(:n, 0)").bindparams(n=name)
        holder_query = sa.text("SELECT IS_USED_LOCK(:n)").bindparams(n=name)
        wait = sa.text("SELECT GET_LOCK(:n, :s)").bindparams(n=name, s=max(1, int(wait_s)))
    if conn.execute(try_lock).scalar():
        return RepairTurn()
    holder = f"session {conn.execute(holder_query).scalar()}"
    log.warning("repair of %s: waiting for another repair of it to finish (%s)", table, holder)
    began = time.monotonic()
    try:
        result = conn.execute(wait).scalar()
    except sa.exc.OperationalError:
        result = 0  # PostgreSQL's lock_timeout
    # pg_advisory_lock returns void (None) once it holds the lock; GET_LOCK 1, or 0 at its timeout.
    got = result != 0 if dialect == "postgresql" else bool(result)
    if not got:
        raise RetryableError(
            f"repair of {table}: another repair of it ({holder}) held it for more than "
            f"{wait_s:g} s; nothing was pulled or written, run it again"
        )
    return RepairTurn(waited_s=round(time.monotonic() - began, 3), holder=holder)


@contextmanager
def sql_repair_turn(
    engine: sa.Engine, schema: str | None, table: str, *, wait_s: float
) -> Iterator[RepairTurn]:
    """Hold ``table``'s repair turn for the block (see the module); no turn on other databases.

    Raises:
        RetryableError: another repair held the table for longer than ``wait_s``.
    """
    if engine.dialect.name not in ("postgresql", "mysql", "mariadb"):
        yield RepairTurn()
        return
    conn = engine.connect().execution_options(isolation_level="AUTOCOMMIT")
    try:
        yield _take(conn, schema, table, wait_s)
    finally:
        # Closing the session lets go of the lock (and of a wait still queued);
        # invalidate: a pooled connection would keep holding it.
        with suppress(sa.exc.SQLAlchemyError):
            conn.invalidate()
        with suppress(sa.exc.SQLAlchemyError):
            conn.close()
