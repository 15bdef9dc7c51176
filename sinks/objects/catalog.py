"""What the PostgreSQL catalog says of an engine object, as findings; and taking back grants.

Every check reads ``pg_class`` / ``pg_namespace`` by schema and name, never
through the search_path, and reports every finding at once (a message that
names one problem per start-up would take an operator several starts).
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

__all__ = [
    "RELATION_FACTS_SQL",
    "WRITE_PRIVILEGES",
    "relation_exists",
    "relation_facts",
    "relation_problems",
    "revoke_relation",
    "revoke_schema",
    "schema_exists",
    "schema_problems",
    "trusted_roles",
]

WRITE_PRIVILEGES = ("INSERT", "UPDATE", "DELETE", "TRUNCATE", "TRIGGER", "REFERENCES")

# Grantees (and privileges) of the relation's ACL other than its owner and the
# trusted roles; PUBLIC is grantee 0.
_OTHERS = """
SELECT array_agg(DISTINCT CASE WHEN x.grantee = 0 THEN 'PUBLIC'
                               ELSE pg_get_userbyid(x.grantee) END || ' ' || x.privilege_type)
  FROM aclexplode({acl}) x
 WHERE x.grantee <> {owner}
   AND (x.grantee = 0 OR pg_get_userbyid(x.grantee) <> ALL(%(trusted)s))
"""

_FACTS_SQL = (
    """
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
       ("""
    + _OTHERS.format(acl="c.relacl", owner="c.relowner")
    + """)
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = %(schema)s AND c.relname = %(table)s
"""
)

_COLUMNS_SQL = """
SELECT attname::text, format_type(atttypid, atttypmod), attnotnull FROM pg_attribute
 WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped ORDER BY attnum
"""

# The owner of a database's schemas is trusted if it is the database's owner
# or a superuser: either can drop and replace the engine's tables anyway.
_SCHEMA_SQL = (
    """
SELECT pg_get_userbyid(n.nspowner),
       n.nspowner = (SELECT datdba FROM pg_database WHERE datname = current_database())
       OR pg_get_userbyid(n.nspowner) = 'pg_database_owner'
       OR (SELECT rolsuper FROM pg_roles WHERE oid = n.nspowner),
       ("""
    + _OTHERS.format(acl="n.nspacl", owner="n.nspowner")
    + """)
  FROM pg_namespace n WHERE n.nspname = %(schema)s
"""
)

# Everything the checks below read of a table and its schema, as one line of text: owner,
# kind, persistence, row-level security, the whole ACL, triggers, rules, policies, primary
# key, columns, the schema's owner and ACL. Not a rule: a fingerprint of what a rule vetted.
# A process that cannot run the checks (the JVM writer's tasks) runs this instead and
# requires the line the checks passed on, so the rule is written once, here in Python, and
# anything that changed since (a grant, a column, a trigger) is refused. Positional
# parameters (schema, table), written %s (JDBC takes them as ?); no row: no such table.
RELATION_FACTS_SQL = """
SELECT concat_ws(' | ',
  'owner ' || pg_get_userbyid(c.relowner),
  'kind ' || c.relkind::text,
  'persistence ' || c.relpersistence::text,
  'row security ' || (c.relrowsecurity OR c.relforcerowsecurity)::text,
  'acl ' || coalesce(c.relacl::text, 'default'),
  'triggers ' || coalesce((SELECT string_agg(t.tgname::text, ',' ORDER BY t.tgname)
                             FROM pg_trigger t WHERE t.tgrelid = c.oid), ''),
  'rules ' || coalesce((SELECT string_agg(r.rulename::text, ',' ORDER BY r.rulename)
                          FROM pg_rewrite r WHERE r.ev_class = c.oid), ''),
  'policies ' || coalesce((SELECT string_agg(p.polname::text, ',' ORDER BY p.polname)
                             FROM pg_policy p WHERE p.polrelid = c.oid), ''),
  'key ' || coalesce((SELECT string_agg(a.attname::text, ',' ORDER BY k.ord) FROM pg_index i
                        CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
                        JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
                       WHERE i.indrelid = c.oid AND i.indisprimary AND i.indisvalid
                         AND i.indimmediate), ''),
  'columns ' || coalesce((SELECT string_agg(a.attname::text || ' ' || format_type(a.atttypid,
                            a.atttypmod) || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END,
                            ', ' ORDER BY a.attnum)
                            FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attnum > 0
                             AND NOT a.attisdropped), ''),
  'schema owner ' || pg_get_userbyid(n.nspowner),
  'schema acl ' || coalesce(n.nspacl::text, 'default'))
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = %s AND c.relname = %s
"""

_KINDS = {
    "v": "a view",
    "m": "a materialized view",
    "p": "a partitioned table",
    "f": "a foreign table",
    "i": "an index",
    "S": "a sequence",
    "c": "a composite type",
}
_PERSISTENCE = {"p": "logged", "u": "unlogged", "t": "temporary"}


def trusted_roles(conn: psycopg.Connection[Any], also: str | None = None) -> list[str]:
    """The session's role, then ``also`` (a role trusted to own the engine's objects)."""
    row = conn.execute("SELECT current_user::text").fetchone()
    assert row is not None
    return [str(row[0])] + ([also] if also else [])


def schema_exists(conn: psycopg.Connection[Any], schema: str) -> bool:
    """Whether ``schema`` exists (by name: the search_path plays no part)."""
    found = conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone()
    return found is not None


def relation_exists(conn: psycopg.Connection[Any], schema: str, name: str) -> bool:
    """Whether any relation (table, view, index, ...) ``schema.name`` exists."""
    found = conn.execute(
        "SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s AND c.relname = %s",
        (schema, name),
    ).fetchone()
    return found is not None


def relation_facts(conn: psycopg.Connection[Any], schema: str, name: str) -> str | None:
    """The line :data:`RELATION_FACTS_SQL` gives of ``schema.name`` (None: no such table)."""
    row = conn.execute(RELATION_FACTS_SQL, (schema, name)).fetchone()
    return None if row is None else str(row[0])


def _grant_problems(name: str, grants: list[str] | None) -> list[str]:
    """A relation's grants to other roles, as findings: writes and reads apart."""
    if not grants:
        return []
    writes = sorted(g for g in grants if g.rsplit(" ", 1)[1] in WRITE_PRIVILEGES)
    reads = sorted(g for g in grants if g.rsplit(" ", 1)[1] not in WRITE_PRIVILEGES)
    found = []
    if writes:
        found.append(f"{name} is writable by other roles: {writes}")
    if reads:
        # A read matters too: a staged row read by another role is a row the
        # target's own grants and row-level security may hide from it.
        found.append(f"{name} is readable by other roles: {reads}")
    return found


def relation_problems(
    conn: psycopg.Connection[Any],
    schema: str,
    name: str,
    *,
    columns: dict[str, tuple[str, bool]],
    key: tuple[str, ...],
    persistence: str,
    trusted: list[str],
) -> list[str]:
    """What is wrong with the engine's table ``schema.name``, as sentences (empty: nothing).

    Args:
        conn: any connection of the engine's role.
        schema, name: where the table is.
        columns: the expected columns, name -> (format_type(), NOT NULL).
        key: the expected primary key (empty: the table must have none).
        persistence: the expected ``relpersistence`` ('p' logged, 'u' unlogged).
        trusted: the roles that may own the table and hold grants on it.
    """
    row = conn.execute(_FACTS_SQL, {"schema": schema, "table": name, "trusted": trusted}).fetchone()
    shown = f"{schema}.{name}"
    if row is None:
        return [f"{shown} does not exist"]
    oid, relkind, found_persistence, owner, rls, triggers, rules, policies, pkey, grants = row
    if relkind != "r":
        return [f"{shown} is {_KINDS.get(relkind, f'relkind {relkind!r}')}, not a plain table"]
    problems = []
    if owner not in trusted:
        problems.append(f"{shown} is owned by role {owner!r}, not by {' or '.join(trusted)}")
    if found_persistence != persistence:
        # A logged table that is unlogged is emptied by crash recovery: every
        # marker would vanish.
        problems.append(
            f"{shown} is {_PERSISTENCE.get(found_persistence, found_persistence)}, "
            f"not {_PERSISTENCE[persistence]}"
        )
    if list(pkey or []) != list(key):
        found_key = f"primary key ({', '.join(pkey)})" if pkey else "no (immediate) primary key"
        wanted = f"PRIMARY KEY ({', '.join(key)})" if key else "no primary key"
        problems.append(f"{shown} has {found_key}, not {wanted}")
    if triggers:
        problems.append(f"{shown} has triggers {list(triggers)}")
    if rules:
        problems.append(f"{shown} has rules {list(rules)}")
    if rls or policies:
        named = f" (policies {list(policies)})" if policies else ""
        problems.append(f"{shown} has row-level security{named}")
    problems += _grant_problems(shown, grants)
    found = {r[0]: (r[1], bool(r[2])) for r in conn.execute(_COLUMNS_SQL, (oid,)).fetchall()}
    if found != columns:
        wanted = ", ".join(f"{c} {t}{' NOT NULL' if n else ''}" for c, (t, n) in columns.items())
        got = ", ".join(f"{c} {t}{' NOT NULL' if n else ''}" for c, (t, n) in found.items())
        problems.append(f"{shown} has columns ({got}), expected ({wanted})")
    return problems


def schema_problems(conn: psycopg.Connection[Any], schema: str, trusted: list[str]) -> list[str]:
    """What is wrong with the engine's schema, as sentences (empty: nothing).

    Its owner can drop and replace every table in it, so it must be trusted;
    and no other role may use it: ``USAGE`` reaches its tables (with any grant
    default privileges gave), ``CREATE`` plants tables the engine would create.
    """
    row = conn.execute(_SCHEMA_SQL, {"schema": schema, "trusted": trusted}).fetchone()
    if row is None:
        return [f"schema {schema} does not exist"]
    owner, owner_trusted, grants = row
    problems = []
    if owner not in trusted and not owner_trusted:
        problems.append(
            f"schema {schema} is owned by role {owner!r}, who can drop and replace these tables"
        )
    if grants:
        problems.append(
            f"schema {schema} grants {sorted(grants)}: other roles may use it (USAGE reaches "
            "its tables, CREATE plants tables where the engine would create its own)"
        )
    return problems


def _revoke(
    conn: psycopg.Connection[Any], query: str, param: str, kind: str, ident: sql.Identifier
) -> None:
    grantees = conn.execute(query, (param,)).fetchall()
    for (grantee,) in grantees:
        role = sql.SQL("PUBLIC") if grantee is None else sql.Identifier(grantee)
        conn.execute(sql.SQL("REVOKE ALL ON {} {} FROM {}").format(sql.SQL(kind), ident, role))


def revoke_relation(conn: psycopg.Connection[Any], schema: str, name: str) -> None:
    """Take back every privilege on a table just created that a role other than its owner got.

    Default privileges (``ALTER DEFAULT PRIVILEGES ... GRANT ... ON TABLES``)
    are applied at CREATE; run in the creating transaction, so that no other
    role ever sees the table with them.
    """
    _revoke(
        conn,
        "SELECT DISTINCT CASE WHEN x.grantee = 0 THEN NULL ELSE pg_get_userbyid(x.grantee) END "
        "FROM pg_class c CROSS JOIN LATERAL aclexplode(c.relacl) x "
        "WHERE c.oid = %s::regclass AND x.grantee <> c.relowner",
        sql.Identifier(schema, name).as_string(conn),
        "TABLE",
        sql.Identifier(schema, name),
    )


def revoke_schema(conn: psycopg.Connection[Any], schema: str) -> None:
    """Take back every privilege on a schema just created that a role other than its owner got."""
    _revoke(
        conn,
        "SELECT DISTINCT CASE WHEN x.grantee = 0 THEN NULL ELSE pg_get_userbyid(x.grantee) END "
        "FROM pg_namespace n CROSS JOIN LATERAL aclexplode(n.nspacl) x "
        "WHERE n.nspname = %s AND x.grantee <> n.nspowner",
        schema,
        "SCHEMA",
        sql.Identifier(schema),
    )
