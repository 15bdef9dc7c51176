"""Where the marker and fence tables live, and the start-up check that they are really ours.

The two tables decide what is committed and who may write, so a table that
someone else planted (without the primary key, with a trigger that runs with
the sink's privileges, with rules, row-level security, or writable by other
roles) would break exactly-once silently. Before they are used, every start-up
checks them against the expected definition and refuses, saying what it found.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import psycopg
from psycopg import errors, sql

from reconcile.contract import ConfigurationError

from .markers import (
    FENCES_COLUMNS,
    FENCES_KEY,
    FENCES_TABLE,
    MARKERS_COLUMNS,
    MARKERS_KEY,
    MARKERS_TABLE,
    REPAIRS_COLUMNS,
    REPAIRS_KEY,
    REPAIRS_TABLE,
    StateTables,
)

__all__ = ["DEFAULT_STATE_SCHEMA", "open_state_tables"]

log = logging.getLogger("reconcile.sinks.postgres")

# The dedicated schema for the engine's tables when state_schema is not given.
DEFAULT_STATE_SCHEMA = "reconcile"

_WRITE_PRIVILEGES = ("INSERT", "UPDATE", "DELETE", "TRUNCATE", "TRIGGER", "REFERENCES")

_FACTS_SQL = """
SELECT c.oid, c.relkind, c.relpersistence, pg_get_userbyid(c.relowner),
       c.relrowsecurity OR c.relforcerowsecurity,
       (SELECT array_agg(t.tgname::text ORDER BY t.tgname) FROM pg_trigger t
         WHERE t.tgrelid = c.oid),
       (SELECT array_agg(r.rulename::text ORDER BY r.rulename) FROM pg_rewrite r
         WHERE r.ev_class = c.oid),
       (SELECT array_agg(p.polname::text ORDER BY p.polname) FROM pg_policy p
         WHERE p.polrelid = c.oid),
       (SELECT array_agg(a.attname::text ORDER BY k.ord) FROM pg_index i
         CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
         JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
         WHERE i.indrelid = c.oid AND i.indisprimary AND i.indisvalid AND i.indimmediate),
       (SELECT array_agg(DISTINCT CASE WHEN x.grantee = 0 THEN 'PUBLIC'
                                       ELSE pg_get_userbyid(x.grantee) END
                         || ' ' || x.privilege_type)
          FROM aclexplode(c.relacl) x
         WHERE x.privilege_type = ANY(%(writes)s) AND x.grantee <> c.relowner
           AND (x.grantee = 0 OR pg_get_userbyid(x.grantee) <> ALL(%(trusted)s)))
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = %(schema)s AND c.relname = %(table)s
"""

_COLUMNS_SQL = """
SELECT attname::text, format_type(atttypid, atttypmod), attnotnull FROM pg_attribute
 WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped ORDER BY attnum
"""

_SCHEMA_OWNER_SQL = """
SELECT pg_get_userbyid(n.nspowner),
       n.nspowner = (SELECT datdba FROM pg_database WHERE datname = current_database())
       OR pg_get_userbyid(n.nspowner) = 'pg_database_owner'
       OR (SELECT rolsuper FROM pg_roles WHERE oid = n.nspowner)
  FROM pg_namespace n WHERE n.nspname = %s
"""


def _relation_exists(conn: psycopg.Connection[Any], schema: str, table: str) -> bool:
    row = conn.execute(
        "SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s AND c.relname = %s",
        (schema, table),
    ).fetchone()
    return row is not None


def _schema_exists(conn: psycopg.Connection[Any], schema: str) -> bool:
    return (
        conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone()
        is not None
    )


def _locate(conn: psycopg.Connection[Any], explicit: str | None, target_schema: str) -> str:
    """The schema of the state tables (created if needed; autocommit)."""
    if explicit is not None:
        if not _schema_exists(conn, explicit):
            with contextlib.suppress(errors.UniqueViolation, errors.DuplicateSchema):
                conn.execute(
                    sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(explicit))
                )
        return explicit
    # Never split the markers of one database over two schemas: a marker the
    # sink does not look at is an epoch it would write twice. So wherever
    # reconcile_commits already is, it stays; both places at once is refused.
    candidates = list(dict.fromkeys([DEFAULT_STATE_SCHEMA, target_schema]))
    found = [s for s in candidates if _relation_exists(conn, s, MARKERS_TABLE)]
    if len(found) > 1:
        raise ConfigurationError(
            f"postgres sink: both {found[0]}.{MARKERS_TABLE} and {found[1]}.{MARKERS_TABLE} "
            "exist, so where this sink's markers are is ambiguous. Give state_schema= the "
            "one that holds them (and drop the other once it is empty)",
            schemas=found,
        )
    if found:
        return found[0]
    if _schema_exists(conn, DEFAULT_STATE_SCHEMA):
        return DEFAULT_STATE_SCHEMA
    try:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(DEFAULT_STATE_SCHEMA)))
    except (errors.DuplicateSchema, errors.UniqueViolation):
        return DEFAULT_STATE_SCHEMA  # created meanwhile by another sink
    except errors.InsufficientPrivilege:
        log.warning(
            "postgres sink: cannot create schema %r (no CREATE on the database); keeping the "
            "marker and fence tables in the target's schema %r",
            DEFAULT_STATE_SCHEMA,
            target_schema,
        )
        return target_schema
    return DEFAULT_STATE_SCHEMA


def _check_table(
    conn: psycopg.Connection[Any],
    schema: str,
    table: str,
    expected: dict[str, tuple[str, bool]],
    key: tuple[str, ...],
    trusted: list[str],
) -> list[str]:
    """What is wrong with one state table, as sentences (empty: it is fine)."""
    row = conn.execute(
        _FACTS_SQL,
        {"schema": schema, "table": table, "writes": list(_WRITE_PRIVILEGES), "trusted": trusted},
    ).fetchone()
    name = f"{schema}.{table}"
    if row is None:
        return [f"{name} does not exist"]
    oid, relkind, persistence, owner, rls, triggers, rules, policies, pkey, grants = row
    problems = []
    if relkind != "r":
        kinds = {"v": "a view", "m": "a materialized view", "p": "a partitioned table"}
        return [f"{name} is {kinds.get(relkind, f'relkind {relkind!r}')}, not a plain table"]
    if owner not in trusted:
        problems.append(f"{name} is owned by role {owner!r}, not by {' or '.join(trusted)}")
    if persistence != "p":
        # An unlogged table is emptied by crash recovery: every marker would vanish.
        problems.append(f"{name} is {'unlogged' if persistence == 'u' else 'temporary'}")
    if list(pkey or []) != list(key):
        found_key = f"primary key ({', '.join(pkey)})" if pkey else "no (immediate) primary key"
        problems.append(f"{name} has {found_key}, not PRIMARY KEY ({', '.join(key)})")
    if triggers:
        problems.append(f"{name} has triggers {list(triggers)}")
    if rules:
        problems.append(f"{name} has rules {list(rules)}")
    if rls or policies:
        problems.append(
            f"{name} has row-level security" + (f" (policies {list(policies)})" if policies else "")
        )
    if grants:
        problems.append(f"{name} is writable by other roles: {sorted(grants)}")
    columns = {r[0]: (r[1], bool(r[2])) for r in conn.execute(_COLUMNS_SQL, (oid,)).fetchall()}
    if columns != expected:
        wanted = ", ".join(f"{c} {t}{' NOT NULL' if n else ''}" for c, (t, n) in expected.items())
        got = ", ".join(f"{c} {t}{' NOT NULL' if n else ''}" for c, (t, n) in columns.items())
        problems.append(f"{name} has columns ({got}), expected ({wanted})")
    return problems


def open_state_tables(
    conn: psycopg.Connection[Any],
    *,
    explicit_schema: str | None,
    target_schema: str,
    state_owner: str | None,
    what: str,
) -> StateTables:
    """Find or create the marker and fence tables, then check that they can be trusted.

    Args:
        conn: an autocommit connection as the sink's role.
        explicit_schema: ``state_schema=`` if given; else the dedicated schema
            ``reconcile`` (created if possible), or the target's schema where
            the tables already are, or when ``reconcile`` cannot be created.
        target_schema: the target table's schema.
        state_owner: another role trusted to own the tables and their schema
            (e.g. a migration role that created them and granted them to us).
        what: who asks, for messages ("postgres sink 'orders'").

    Raises:
        ConfigurationError: the tables cannot be created (privileges), or an
            existing one is not what it must be; the message lists every
            finding and what to do.
    """
    schema = _locate(conn, explicit_schema, target_schema)
    state = StateTables(schema)
    missing = tuple(
        t
        for t in (MARKERS_TABLE, FENCES_TABLE, REPAIRS_TABLE)
        if not _relation_exists(conn, schema, t)
    )
    try:
        if missing:
            state.create(conn, missing)
    except errors.InsufficientPrivilege as err:
        if missing == (REPAIRS_TABLE,):
            # A schema set up before repairs were recorded, where this role may
            # not create: epochs need only the other two; a repair says what to do.
            log.warning(
                "postgres sink: cannot create %s (%s); pull-and-diff repairs need it",
                state.display(REPAIRS_TABLE),
                str(err).strip(),
            )
            missing = ()
        else:
            raise ConfigurationError(
                f"{what}: cannot create {state.display(MARKERS_TABLE)} and "
                f"{state.display(FENCES_TABLE)}: {str(err).strip()}. Grant CREATE on schema "
                f"{schema} to the sink's role (once), or create schema {DEFAULT_STATE_SCHEMA} "
                "AUTHORIZATION <the sink's role>, or give state_schema= a schema it may create in",
                schema=schema,
            ) from None
    me = conn.execute("SELECT current_user::text").fetchone()
    assert me is not None
    trusted = [str(me[0])] + ([state_owner] if state_owner else [])
    problems = []
    for table, columns, key in (
        (MARKERS_TABLE, MARKERS_COLUMNS, MARKERS_KEY),
        (FENCES_TABLE, FENCES_COLUMNS, FENCES_KEY),
        (REPAIRS_TABLE, REPAIRS_COLUMNS, REPAIRS_KEY),
    ):
        if table == REPAIRS_TABLE and not _relation_exists(conn, schema, table):
            continue  # could not be created (logged above): epochs do not need it
        problems += _check_table(conn, schema, table, columns, key, trusted)
    owner = conn.execute(_SCHEMA_OWNER_SQL, (schema,)).fetchone()
    if owner is not None and owner[0] not in trusted and not owner[1]:
        # The owner of a schema can drop and replace any table in it.
        problems.append(
            f"schema {schema} is owned by role {owner[0]!r}, who can drop and replace these tables"
        )
    if problems:
        raise ConfigurationError(
            f"{what}: refusing to use the marker and fence tables in schema {schema}: "
            + "; ".join(problems)
            + ". These tables decide which epochs are committed and who may write, so they "
            f"must be owned by the sink's role ({trusted[0]}) or by state_owner=, have exactly "
            "the expected columns and primary key, and have no triggers, rules, row-level "
            "security or write grants to other roles. Fix or drop them as their owner, or give "
            f"state_schema= a schema of the sink's own (e.g. CREATE SCHEMA "
            f"{DEFAULT_STATE_SCHEMA} AUTHORIZATION {trusted[0]})",
            schema=schema,
            problems=problems,
        )
    return state
