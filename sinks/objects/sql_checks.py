"""The bind-time check of the SQL sink's own tables on MySQL and MariaDB.

The engine's markers, fences and repairs decide whether an epoch is in the
sink: whoever can write them can make the engine skip an epoch or let a
zombie through. So, as for the Postgres sink's objects, each is checked
before use, at every bind, and refused with its name and the problem:

- it is a base table (a view or a sequence planted under its name is not);
- it has exactly the declared columns and primary key;
- no trigger is defined on it;
- no user but the sink's own holds a privilege on it, on one of its columns,
  or a write privilege on the database that holds it (a database-level grant
  reaches every table in it, future ones included).

Global privileges (``*.*``) are not checked: they are the server's
administrators', as a superuser is PostgreSQL's. MySQL has no table owner
and no row-level security, so those checks have nothing to read. SQLite has
no users, triggers aside; other dialects are not checked (the docs say so).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa

from reconcile.core.contract import ConfigurationError

__all__ = ["CHECKED_DIALECTS", "check_sql_state"]

CHECKED_DIALECTS = frozenset({"mysql", "mariadb"})
# Database-level privileges that let another user change or replace the tables.
_WRITES = ("INSERT", "UPDATE", "DELETE", "DROP", "ALTER", "TRIGGER", "CREATE", "INDEX")


def _grantee(current_user: str) -> str:
    """``user@host`` (CURRENT_USER()) as information_schema spells a grantee: ``'user'@'host'``."""
    user, _, host = current_user.rpartition("@")
    return f"'{user}'@'{host}'"


def check_sql_state(conn: sa.Connection, tables: Sequence[sa.Table], sink: str) -> None:
    """Refuse the SQL sink's tables if another user can write them, or they are not as declared.

    Raises:
        ConfigurationError: naming the table and the problem (and what to do).
    """
    if conn.dialect.name not in CHECKED_DIALECTS or not tables:
        return
    schema = tables[0].schema or conn.exec_driver_sql("SELECT DATABASE()").scalar_one()
    me = _grantee(str(conn.exec_driver_sql("SELECT CURRENT_USER()").scalar_one()))
    names = [t.name for t in tables]
    placeholders = ", ".join(["%s"] * len(names))

    def rows(query: str, *extra: str) -> list[tuple[str, ...]]:
        found = conn.exec_driver_sql(query, (schema, *names, *extra)).fetchall()
        return [tuple(str(v) for v in r) for r in found]

    def refuse(table: str, problem: str) -> ConfigurationError:
        return ConfigurationError(
            f"sql sink {sink!r}: the engine's table `{schema}`.`{table}` {problem}; it decides "
            "which epochs are in the sink, so the sink refuses to use it. Drop or fix it "
            "(the sink creates its tables when they are missing), or give the sink a "
            "state_schema (a database of its own) that only its user can write"
        )

    kinds = {name: kind for name, kind in rows(
        "SELECT TABLE_NAME, TABLE_TYPE FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s "
        f"AND TABLE_NAME IN ({placeholders})"
    )}  # fmt: skip
    for name in names:
        if kinds.get(name) != "BASE TABLE":
            raise refuse(name, f"is a {kinds.get(name) or 'missing object'}, not a base table")
    found_columns: dict[str, list[str]] = {name: [] for name in names}
    found_key: dict[str, list[str]] = {name: [] for name in names}
    for name, column, column_key in rows(
        "SELECT TABLE_NAME, COLUMN_NAME, COLUMN_KEY FROM information_schema.COLUMNS "
        f"WHERE TABLE_SCHEMA = %s AND TABLE_NAME IN ({placeholders})"
    ):
        found_columns[name].append(column)
        if column_key == "PRI":
            found_key[name].append(column)
    for table in tables:
        columns = sorted(c.name for c in table.columns)
        key = sorted(c.name for c in table.primary_key.columns)
        if sorted(found_columns[table.name]) != columns:
            raise refuse(
                table.name, f"has columns {sorted(found_columns[table.name])}, not {columns}"
            )
        if sorted(found_key[table.name]) != key:
            raise refuse(table.name, f"has primary key {sorted(found_key[table.name])}, not {key}")
    for name, trigger in rows(
        "SELECT EVENT_OBJECT_TABLE, TRIGGER_NAME FROM information_schema.TRIGGERS "
        f"WHERE EVENT_OBJECT_SCHEMA = %s AND EVENT_OBJECT_TABLE IN ({placeholders})"
    ):
        raise refuse(name, f"has a trigger, {trigger!r}")
    for view in ("TABLE_PRIVILEGES", "COLUMN_PRIVILEGES"):
        for name, grantee, privilege in rows(
            f"SELECT TABLE_NAME, GRANTEE, PRIVILEGE_TYPE FROM information_schema.{view} "
            f"WHERE TABLE_SCHEMA = %s AND TABLE_NAME IN ({placeholders}) AND GRANTEE <> %s",
            me,
        ):
            raise refuse(name, f"grants {privilege} to {grantee}, another user than the sink's")
    writes = ", ".join(f"'{w}'" for w in _WRITES)
    for grantee, privilege in conn.exec_driver_sql(
        # A database-level grant may name a pattern (`shop%`.*): matched as the server does.
        "SELECT GRANTEE, PRIVILEGE_TYPE FROM information_schema.SCHEMA_PRIVILEGES "
        f"WHERE %s LIKE TABLE_SCHEMA AND GRANTEE <> %s AND PRIVILEGE_TYPE IN ({writes})",
        (schema, me),
    ).fetchall():
        raise refuse(
            names[0],
            f"is in a database where {grantee} holds {privilege} (a database-level grant "
            "reaches every table in it)",
        )
