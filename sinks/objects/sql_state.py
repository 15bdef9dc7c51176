"""The generic SQL sink's objects, in any database SQLAlchemy speaks: three tables, a temp table.

The same three facts as the Postgres sink's tables, under their own names
(``reconcile_sql_*``) so that both sinks can share a database: a marker per
committed epoch, the newest writer generation per (pipeline, sink), one row
per repair. They are created through SQLAlchemy in ``state_schema`` (default:
the connection's), and checked at every bind on MySQL and MariaDB
(``sql_checks.py``: kind, engine, columns, triggers, other users' grants).
Other dialects are not checked: owners, triggers and grants are spelt
differently in every database, and SQLite has no users.

On MySQL and MariaDB they are InnoDB tables whatever the server's default
engine (a MyISAM marker would survive the rollback of its epoch, which would
then never be written), and the pipeline and sink names are ``ascii_bin``
(the database's default collation would take ``Shop`` and ``shop`` for one
pipeline).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import mysql

from sinks.objects.sql_checks import check_sql_state

__all__ = [
    "SQL_FENCES",
    "SQL_MARKERS",
    "SQL_REPAIRS",
    "SQL_SCOPE_KEYS",
    "STATE_ENGINE",
    "create_scope_keys",
    "create_sql_state",
    "sql_state_tables",
]

SQL_MARKERS = "reconcile_sql_commits"
SQL_FENCES = "reconcile_sql_fences"
SQL_REPAIRS = "reconcile_sql_repairs"
# Scoped pull-and-diff stages the keys it looks up in this temporary table.
SQL_SCOPE_KEYS = "_reconcile_scope_keys"
# The only storage engine of MySQL and MariaDB whose writes roll back with
# their transaction (and the one every server has).
STATE_ENGINE = "InnoDB"
_MYSQL = ("mysql", "mariadb")  # SQLAlchemy's two names for the dialect
_ON_MYSQL: dict[str, Any] = {f"{d}_engine": STATE_ENGINE for d in _MYSQL}


def _name_type() -> sa.types.TypeEngine[str]:
    """A pipeline's or sink's name: binary on MySQL and MariaDB (text compares without case)."""
    binary = mysql.VARCHAR(63, charset="ascii", collation="ascii_bin")
    return sa.String(63).with_variant(binary, *_MYSQL)


def sql_state_tables(schema: str | None) -> tuple[sa.MetaData, sa.Table, sa.Table, sa.Table]:
    """The metadata and the marker, fence and repair tables in ``schema`` (None: the default)."""
    metadata = sa.MetaData(schema=schema)
    markers = sa.Table(
        SQL_MARKERS,
        metadata,
        sa.Column("pipeline", _name_type(), primary_key=True),
        sa.Column("sink", _name_type(), primary_key=True),
        sa.Column("epoch", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("target_table", sa.Text, nullable=False),
        sa.Column("log_id", sa.Text, nullable=True),
        sa.Column("generation", sa.BigInteger, nullable=False),
        sa.Column("row_count", sa.BigInteger, nullable=False),
        **_ON_MYSQL,
    )
    fences = sa.Table(
        SQL_FENCES,
        metadata,
        sa.Column("pipeline", _name_type(), primary_key=True),
        sa.Column("sink", _name_type(), primary_key=True),
        sa.Column("generation", sa.BigInteger, nullable=False),
        sa.Column("log_id", sa.Text, nullable=True),
        **_ON_MYSQL,
    )
    repairs = sa.Table(
        SQL_REPAIRS,
        metadata,
        sa.Column("repair_id", sa.String(36), primary_key=True),
        sa.Column("pipeline", _name_type(), nullable=False),
        sa.Column("sink", _name_type(), nullable=False),
        sa.Column("epoch", sa.BigInteger, nullable=False),
        sa.Column("target_table", sa.Text, nullable=False),
        sa.Column("mode", sa.String(16), nullable=False),
        sa.Column("missing", sa.BigInteger, nullable=False),
        sa.Column("extra", sa.BigInteger, nullable=False),
        sa.Column("changed", sa.BigInteger, nullable=False),
        sa.Column("applied", sa.BigInteger, nullable=False),
        **_ON_MYSQL,
    )
    return metadata, markers, fences, repairs


def create_sql_state(engine: sa.Engine, metadata: sa.MetaData, sink: str) -> None:
    """Create the tables of ``metadata`` (``sql_state_tables``) that are missing; check them all.

    The check (``sql_checks.py``) runs on every call, so on every bind, on the
    tables found as on those just created: where the server has users and
    grants (MySQL, MariaDB), a table another user can write is refused.

    Raises:
        ConfigurationError: a table is not as declared, or another user can write it.
    """
    metadata.create_all(engine, checkfirst=True)
    with engine.connect() as conn:
        check_sql_state(conn, list(metadata.tables.values()), sink)


def create_scope_keys(conn: sa.Connection, columns: Sequence[sa.Column[Any]]) -> sa.Table:
    """A fresh temporary table of ``columns`` (the keys scoped mode looks up), in this session.

    On PostgreSQL it is qualified with ``pg_temp``, never left to the
    search_path; a leftover of this session is dropped first. On MySQL and
    MariaDB by ``DROP TEMPORARY TABLE``, which never reaches a real table of
    that name and needs no privilege (``checkfirst`` would ``DESCRIBE`` it,
    which needs SELECT on the database).
    """
    dialect = conn.dialect.name
    table = sa.Table(
        SQL_SCOPE_KEYS,
        sa.MetaData(),
        *columns,
        prefixes=["TEMPORARY"],
        schema="pg_temp" if dialect == "postgresql" else None,
    )
    if dialect in _MYSQL:
        name = conn.dialect.identifier_preparer.format_table(table)
        conn.exec_driver_sql(f"DROP TEMPORARY TABLE IF EXISTS {name}")
    else:
        table.drop(conn, checkfirst=True)
    table.create(conn)
    return table
