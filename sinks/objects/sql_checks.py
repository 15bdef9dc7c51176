"""The bind-time check of the SQL sink's own tables on MySQL and MariaDB.

The engine's markers, fences and repairs decide whether an epoch is in the
sink: whoever can write them can make the engine skip an epoch or let a
zombie through, and whoever can lock them can stop the pipeline. So, as for
the Postgres sink's objects, each is checked before use, at every bind, and
refused with its name and every problem found:

- it is a base table (a view or a sequence planted under its name is not);
- its engine is InnoDB (a MyISAM table keeps a marker whose epoch rolled back);
- it has exactly the declared columns, each of the declared type, nullability
  and (for the names) collation, and the declared primary key;
- no trigger is defined on it;
- no user but the sink's own holds any privilege on it, on one of its
  columns, or on the database that holds it (a database-level grant reaches
  every table in it, future ones included; reads count too: a user who may
  SELECT may also ``SELECT ... FOR UPDATE`` the fence row and hold the pipeline
  still).

Grants are read from the server's grant tables (``mysql.db``,
``mysql.tables_priv``, ``mysql.columns_priv``), which list every user's, and
not from ``information_schema``'s privilege views, which show a user only its
own (another user's INSERT on the database was invisible there). The sink's
user must be allowed to read them; where it is not, the check cannot see, and
the sink refuses, naming the grant it needs. A role is a grantee like any
user. Global privileges (``*.*``) and PROXY are not checked: they are the
server's administrators', as a superuser is PostgreSQL's. MySQL has no table
owner and no row-level security, so those checks have nothing to read. SQLite
has no users; other dialects are not checked (the docs say so).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from reconcile.core.contract import ConfigurationError

__all__ = ["CHECKED_DIALECTS", "GRANT_TABLES", "check_sql_state"]

CHECKED_DIALECTS = frozenset({"mysql", "mariadb"})
# The grant tables that list every user's privileges below the global level.
GRANT_TABLES = ("mysql.db", "mysql.tables_priv", "mysql.columns_priv")
_ENGINE = "InnoDB"
_DENIED = frozenset({1142, 1143})  # ER_TABLEACCESS_DENIED_ERROR, ER_COLUMNACCESS_DENIED_ERROR


def _account(current_user: str) -> tuple[str, str]:
    """``user@host`` (CURRENT_USER()) as the grant tables' (User, Host)."""
    user, _, host = current_user.rpartition("@")
    return user, host


def _declared(column: sa.Column[Any], dialect: sa.Dialect) -> tuple[str, int | None, str | None]:
    """(DATA_TYPE, length or None, collation or None) that ``column`` is created with."""
    impl = column.type.dialect_impl(dialect)
    data_type = str(impl.compile(dialect=dialect)).split("(")[0].split()[0].lower()
    length = getattr(impl, "length", None) if data_type in ("varchar", "char") else None
    return data_type, length, getattr(impl, "collation", None)


def _table_problems(
    conn: sa.Connection, schema: str, tables: Sequence[sa.Table], shown: dict[str, str]
) -> list[str]:
    """Kind, engine, columns, primary key and triggers of each table, as findings."""
    names = [t.name for t in tables]
    marks = ", ".join(["%s"] * len(names))
    facts = {
        str(name): (str(kind), engine)
        for name, kind, engine in conn.exec_driver_sql(
            "SELECT TABLE_NAME, TABLE_TYPE, ENGINE FROM information_schema.TABLES "
            f"WHERE TABLE_SCHEMA = %s AND TABLE_NAME IN ({marks})",
            (schema, *names),
        )
    }
    columns: dict[str, dict[str, tuple[str, int | None, str | None, bool]]] = {n: {} for n in names}
    keys: dict[str, list[str]] = {n: [] for n in names}
    for table, column, data_type, length, collation, nullable, key in conn.exec_driver_sql(
        "SELECT TABLE_NAME, COLUMN_NAME, DATA_TYPE, CHARACTER_MAXIMUM_LENGTH, COLLATION_NAME, "
        "IS_NULLABLE, COLUMN_KEY FROM information_schema.COLUMNS "
        f"WHERE TABLE_SCHEMA = %s AND TABLE_NAME IN ({marks})",
        (schema, *names),
    ):
        kind = str(data_type).lower()
        size = None if length is None or kind not in ("varchar", "char") else int(length)
        found = (kind, size, None if collation is None else str(collation), nullable == "YES")
        columns[str(table)][str(column)] = found
        if key == "PRI":
            keys[str(table)].append(str(column))
    problems = []
    for table in tables:
        name = shown[table.name]
        kind, engine = facts.get(table.name, ("missing object", None))
        if kind != "BASE TABLE":
            problems.append(f"{name} is a {kind}, not a base table")
            continue
        if engine != _ENGINE:
            problems.append(
                f"{name} is a {engine} table, not {_ENGINE}: its rows do not roll back with "
                "their transaction (a marker would outlive its epoch's rollback)"
            )
        problems += _column_problems(name, table, columns[table.name], conn.dialect)
        key = sorted(c.name for c in table.primary_key.columns)
        if sorted(keys[table.name]) != key:
            problems.append(f"{name} has primary key {sorted(keys[table.name])}, not {key}")
    for table, trigger in conn.exec_driver_sql(
        "SELECT EVENT_OBJECT_TABLE, TRIGGER_NAME FROM information_schema.TRIGGERS "
        f"WHERE EVENT_OBJECT_SCHEMA = %s AND EVENT_OBJECT_TABLE IN ({marks})",
        (schema, *names),
    ):
        problems.append(f"{shown[str(table)]} has a trigger, {str(trigger)!r}")
    return problems


def _column_problems(
    name: str,
    table: sa.Table,
    found: dict[str, tuple[str, int | None, str | None, bool]],
    dialect: sa.Dialect,
) -> list[str]:
    """The columns of one table against its declaration: names, types, nullability, collation."""
    wanted = sorted(c.name for c in table.columns)
    if sorted(found) != wanted:
        return [f"{name} has columns {sorted(found)}, not {wanted}"]
    problems = []
    for column in table.columns:
        data_type, length, collation = _declared(column, dialect)
        kind, size, has_collation, nullable = found[column.name]
        spelt = f"{data_type}({length})" if length is not None else data_type
        if kind != data_type or (length is not None and size != length):
            shown = f"{kind}({size})" if size is not None else kind
            problems.append(f"{name} has column {column.name} of type {shown}, not {spelt}")
        if nullable != bool(column.nullable):
            null = "NULL" if column.nullable else "NOT NULL"
            problems.append(f"{name} has column {column.name} not {null}")
        if collation is not None and has_collation != collation:
            problems.append(
                f"{name} has column {column.name} in collation {has_collation}, not {collation}"
            )
    return problems


def _grant_problems(
    conn: sa.Connection, schema: str, names: list[str], me: tuple[str, str], shown: dict[str, str]
) -> list[str]:
    """Every other user's (or role's) privilege on the tables, their columns or their database."""
    marks = ", ".join(["%s"] * len(names))
    others = "NOT (User = %s AND Host = %s)"
    problems = []
    # A database-level grant may name a pattern (`shop%`.*): matched as the server does.
    database = conn.exec_driver_sql(
        f"SELECT * FROM mysql.db WHERE %s LIKE Db AND {others}", (schema, *me)
    )
    for row in database.mappings():
        held = sorted(
            str(column)[: -len("_priv")].replace("_", " ").upper()
            for column, value in row.items()
            if str(column).endswith("_priv") and value == "Y"
        )
        if held:
            problems.append(
                f"the database `{schema}` grants {', '.join(held)} to '{row['User']}'@"
                f"'{row['Host']}' (database `{row['Db']}`.*: a database-level grant reaches "
                "every table in it)"
            )
    # A column grant is listed per column in columns_priv (and summed up in
    # tables_priv's Column_priv, which adds nothing here).
    tables = f"FROM mysql.tables_priv WHERE Db = %s AND Table_name IN ({marks}) AND {others}"
    columns = f"FROM mysql.columns_priv WHERE Db = %s AND Table_name IN ({marks}) AND {others}"
    for table, user, host, privileges, column in conn.exec_driver_sql(
        f"SELECT Table_name, User, Host, Table_priv, NULL {tables} "
        f"UNION ALL SELECT Table_name, User, Host, Column_priv, Column_name {columns}",
        (schema, *names, *me, schema, *names, *me),
    ):
        if privileges:
            on = "" if column is None else f" (column {column})"
            problems.append(
                f"{shown[str(table)]} grants {str(privileges).upper()}{on} to '{user}'@'{host}'"
            )
    return problems


def check_sql_state(conn: sa.Connection, tables: Sequence[sa.Table], sink: str) -> None:
    """Refuse the SQL sink's tables if another user can reach them, or they are not as declared.

    Raises:
        ConfigurationError: naming each table and every problem (and what to
            do); or, where the sink's user may not read the grant tables,
            naming the grant it needs.
    """
    if conn.dialect.name not in CHECKED_DIALECTS or not tables:
        return
    schema = tables[0].schema or conn.exec_driver_sql("SELECT DATABASE()").scalar_one()
    me = _account(str(conn.exec_driver_sql("SELECT CURRENT_USER()").scalar_one()))
    names = [t.name for t in tables]
    shown = {name: f"`{schema}`.`{name}`" for name in names}
    problems = _table_problems(conn, str(schema), tables, shown)
    try:
        problems += _grant_problems(conn, str(schema), names, me, shown)
    except sa.exc.DBAPIError as err:
        if getattr(err.orig, "args", (None,))[0] not in _DENIED:
            raise
        grants = "; ".join(f"GRANT SELECT ON {t} TO '{me[0]}'@'{me[1]}'" for t in GRANT_TABLES)
        raise ConfigurationError(
            f"sql sink {sink!r}: cannot check who else may reach the engine's tables in "
            f"`{schema}`: its user '{me[0]}'@'{me[1]}' may not read the server's grant tables "
            f"({', '.join(GRANT_TABLES)}), the only place that lists every user's grants. The "
            f"sink refuses to run unchecked; have an administrator run: {grants}"
        ) from None
    if problems:
        raise ConfigurationError(
            f"sql sink {sink!r}: the engine's tables decide which epochs are in the sink, so "
            f"the sink refuses to use them: {'; '.join(problems)}. Drop or fix them (the sink "
            "creates its tables when they are missing, as InnoDB), revoke the grants, or give "
            "the sink a state_schema (a database of its own) that only its user can reach"
        )
