"""The engine's schema and its tables of fixed definition: found, created where missing, checked.

Every function here names its objects by schema and name; the search_path
plays no part. A table is created in one transaction with the revocation of
any privilege default privileges gave another role on it, so no other role
ever sees it with one. Before the engine uses an object, the catalog is read
(``catalog.py``) and the object is refused, with every finding, unless it is
exactly what ``declared.py`` says, owned by a trusted role, and reachable by
no other role.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from typing import Any

import psycopg
from psycopg import errors, sql

from reconcile.core.contract import ConfigurationError

from .catalog import (
    relation_exists,
    relation_facts,
    relation_problems,
    revoke_relation,
    revoke_schema,
    schema_exists,
    schema_problems,
    trusted_roles,
)
from .declared import (
    CREATE_SCHEMA,
    ENGINE_SCHEMA,
    FENCES,
    LEASES,
    MARKERS,
    REALTIME_OFFSETS,
    REPAIRS,
    STATE_TABLES,
    TableDecl,
)

__all__ = [
    "create_in_one_txn",
    "create_schema",
    "create_tables",
    "locate_state_schema",
    "open_lease_table",
    "open_realtime_offsets",
    "open_state_schema",
    "vet_realtime_offsets",
]

log = logging.getLogger("reconcile.sinks.objects")


def create_in_one_txn(
    conn: psycopg.Connection[Any], statements: Sequence[sql.Composed], revoke: Callable[[], None]
) -> bool:
    """Run CREATE statements and ``revoke()`` in one transaction; False if it existed already.

    Raises:
        psycopg.errors.InsufficientPrivilege: the role may not create it.
    """
    try:
        with conn.transaction():
            for statement in statements:
                conn.execute(statement)
            revoke()
    except (errors.DuplicateTable, errors.DuplicateSchema, errors.UniqueViolation):
        # Another session created it meanwhile (CREATE is not atomic in the
        # catalog): it exists, and the check that follows decides about it.
        return False
    return True


def create_schema(conn: psycopg.Connection[Any], schema: str) -> bool:
    """Create ``schema`` (owned by the session's role) unless it exists; True if created."""
    statement = sql.SQL(CREATE_SCHEMA).format(schema=sql.Identifier(schema))
    return create_in_one_txn(conn, [statement], functools.partial(revoke_schema, conn, schema))


def create_tables(conn: psycopg.Connection[Any], schema: str, tables: Sequence[TableDecl]) -> None:
    """Create each of ``tables`` in ``schema`` that is missing (autocommit connection)."""
    for table in tables:
        if relation_exists(conn, schema, table.name):
            continue
        statement = sql.SQL(table.ddl).format(table=sql.Identifier(schema, table.name))
        create_in_one_txn(
            conn, [statement], functools.partial(revoke_relation, conn, schema, table.name)
        )


def _table_problems(
    conn: psycopg.Connection[Any], schema: str, table: TableDecl, trusted: list[str]
) -> list[str]:
    return relation_problems(
        conn,
        schema,
        table.name,
        columns=table.columns,
        key=table.key,
        persistence=table.persistence,
        trusted=trusted,
    )


def _no_schema(what: str, schema: str, err: Exception, option: str) -> ConfigurationError:
    return ConfigurationError(
        f"{what}: cannot create schema {schema}: {str(err).strip()}. The engine keeps its "
        "tables in a schema of its own that no other role may use: create it once for the "
        f"role (CREATE SCHEMA {schema} AUTHORIZATION <the role>), or grant the role CREATE on "
        f"the database, or give {option} a schema the role owns",
        schema=schema,
    )


def locate_state_schema(
    conn: psycopg.Connection[Any], explicit: str | None, target_schema: str, what: str
) -> str:
    """The schema of the marker, fence and repair tables, and of the staging tables.

    ``explicit`` (``state_schema=``) if given, created if missing. Otherwise
    where ``reconcile_commits`` already is, in ``reconcile`` or (as an older
    version placed it) the target's schema; else ``reconcile``, created if
    missing. There is no fallback to the target's schema when ``reconcile``
    cannot be created (see the package's docstring).

    Raises:
        ConfigurationError: the schema cannot be created, or marker tables
            exist in both places.
    """
    if explicit is not None:
        if not schema_exists(conn, explicit):
            try:
                create_schema(conn, explicit)
            except errors.InsufficientPrivilege as err:
                raise _no_schema(what, explicit, err, "state_schema=") from None
        return explicit
    # Never split the markers of one database over two schemas: a marker the
    # sink does not look at is an epoch it would write twice. So wherever
    # reconcile_commits already is, it stays; both places at once is refused.
    candidates = list(dict.fromkeys([ENGINE_SCHEMA, target_schema]))
    found = [s for s in candidates if relation_exists(conn, s, MARKERS.name)]
    if len(found) > 1:
        raise ConfigurationError(
            f"{what}: both {found[0]}.{MARKERS.name} and {found[1]}.{MARKERS.name} exist, so "
            "where this sink's markers are is ambiguous. Give state_schema= the one that holds "
            "them (and drop the other once it is empty)",
            schemas=found,
        )
    if found:
        return found[0]
    if not schema_exists(conn, ENGINE_SCHEMA):
        try:
            create_schema(conn, ENGINE_SCHEMA)
        except errors.InsufficientPrivilege as err:
            raise _no_schema(what, ENGINE_SCHEMA, err, "state_schema=") from None
    return ENGINE_SCHEMA


def open_state_schema(
    conn: psycopg.Connection[Any],
    *,
    explicit_schema: str | None,
    target_schema: str,
    state_owner: str | None,
    what: str,
) -> str:
    """Find or create the marker, fence and repair tables, check them; their schema.

    Args:
        conn: an autocommit connection as the sink's role.
        explicit_schema: ``state_schema=`` if given (see ``locate_state_schema``).
        target_schema: the target table's schema.
        state_owner: another role trusted to own the tables and their schema
            (e.g. a migration role that created them and granted them to us).
        what: who asks, for messages ("postgres sink 'orders'").

    Raises:
        ConfigurationError: the schema or the tables cannot be created
            (privileges), or what exists is not what it must be; the message
            lists every finding and what to do.
    """
    schema = locate_state_schema(conn, explicit_schema, target_schema, what)
    trusted = trusted_roles(conn, state_owner)
    problems = schema_problems(conn, schema, trusted)
    if not problems:  # nothing is created in a schema that is not ours
        for table in STATE_TABLES:
            try:
                create_tables(conn, schema, [table])
            except errors.InsufficientPrivilege as err:
                if table is REPAIRS:
                    # A schema set up before repairs were recorded, where this
                    # role may not create: epochs need only the other two; a
                    # repair says what to do.
                    log.warning(
                        "%s: cannot create %s.%s (%s); pull-and-diff repairs need it",
                        what, schema, table.name, str(err).strip(),
                    )  # fmt: skip
                    continue
                raise ConfigurationError(
                    f"{what}: cannot create {schema}.{MARKERS.name} and "
                    f"{schema}.{FENCES.name}: {str(err).strip()}. Grant CREATE on "
                    f"schema {schema} to the sink's role (once), or create schema "
                    f"{ENGINE_SCHEMA} AUTHORIZATION <the sink's role>, or give state_schema= a "
                    "schema it may create in",
                    schema=schema,
                ) from None
    for table in STATE_TABLES:
        if not relation_exists(conn, schema, table.name):
            # Only in a schema refused above (nothing was created there), or the
            # repairs table the role could not create (logged above).
            continue
        problems += _table_problems(conn, schema, table, trusted)
    if problems:
        moved = ""
        if schema != ENGINE_SCHEMA and explicit_schema is None:
            moved = (
                f". To move them out of the target's schema, with no pipeline running: CREATE "
                f"SCHEMA {ENGINE_SCHEMA} AUTHORIZATION {trusted[0]}, then ALTER TABLE "
                f"{schema}.<each of {', '.join(t.name for t in STATE_TABLES)}> SET SCHEMA "
                f"{ENGINE_SCHEMA}"
            )
        raise ConfigurationError(
            f"{what}: refusing to use the marker and fence tables in schema {schema}: "
            + "; ".join(problems)
            + ". These tables decide which epochs are committed and who may write, so they "
            f"must be owned by the sink's role ({trusted[0]}) or by state_owner=, have exactly "
            "the expected columns and primary key, and have no triggers, rules, row-level "
            "security or grants to other roles, in a schema no other role may use. Fix or drop "
            f"them as their owner, or give state_schema= a schema of the sink's own (e.g. "
            f"CREATE SCHEMA {ENGINE_SCHEMA} AUTHORIZATION {trusted[0]})" + moved,
            schema=schema,
            problems=problems,
        )
    return schema


def _create_and_check(
    conn: psycopg.Connection[Any],
    schema: str,
    table: TableDecl,
    trusted: list[str],
    *,
    what: str,
    role: str,
) -> list[str]:
    """Create ``schema`` and ``table`` where missing (nowhere amiss); every finding on them.

    Each engine table that decides something on its own (the lease, Real-Time
    Mode's offset markers) is opened this way; the caller refuses a table with
    findings, in words that say what the table decides.

    Raises:
        ConfigurationError: ``role`` may not create the schema or the table.
    """
    try:
        if not schema_exists(conn, schema):
            create_schema(conn, schema)
        problems = schema_problems(conn, schema, trusted)
        if not problems:  # nothing is created in a schema that is not ours
            create_tables(conn, schema, [table])
    except errors.InsufficientPrivilege as err:
        raise ConfigurationError(
            f"{what}: cannot create {schema}.{table.name}: {str(err).strip()}. Create schema "
            f"{schema} once for the {role}'s role (CREATE SCHEMA {schema} AUTHORIZATION "
            f"{trusted[0]}), or grant it CREATE on the database",
            schema=schema,
        ) from None
    if relation_exists(conn, schema, table.name):
        problems += _table_problems(conn, schema, table, trusted)
    return problems


def open_lease_table(
    conn: psycopg.Connection[Any], schema: str, *, owner: str | None, what: str
) -> sql.Identifier:
    """Find or create the lease table in ``schema``, check it; its qualified name.

    Raises:
        ConfigurationError: the role may not create the schema or the table,
            or what exists is not what it must be (named, with every finding).
    """
    trusted = trusted_roles(conn, owner)
    problems = _create_and_check(conn, schema, LEASES, trusted, what=what, role="lease")
    if problems:
        raise ConfigurationError(
            f"{what}: refusing to use the lease table {schema}.{LEASES.name}: "
            + "; ".join(problems)
            + ". The lease decides which instance leads, so its table must be owned by the "
            f"lease's role ({trusted[0]}), have exactly the expected columns and primary key, "
            "and have no triggers, rules, row-level security or grants to other roles, in a "
            "schema no other role may use. Drop it as its owner (a lease row is taken anew), "
            f"or give the lease a schema of its own (CREATE SCHEMA {ENGINE_SCHEMA} "
            f"AUTHORIZATION {trusted[0]})",
            schema=schema,
            problems=problems,
        )
    return sql.Identifier(schema, LEASES.name)


def _markers_refused(what: str, schema: str, trusted: list[str], problems: list[str]) -> Exception:
    # The markers decide which rows a replay skips: a table another role can write,
    # or of another shape, could make the writer drop rows, so it is never used.
    return ConfigurationError(
        f"{what}: refusing to use the offset markers {schema}.{REALTIME_OFFSETS.name}: "
        + "; ".join(problems)
        + f". Drop it as its owner ({trusted[0]}), or give the writer a schema of its own",
        schema=schema,
        problems=problems,
    )


def open_realtime_offsets(
    conn: psycopg.Connection[Any], schema: str, *, what: str
) -> sql.Identifier:
    """Find or create Real-Time Mode's offset markers in ``schema``, check them; the table.

    Raises:
        ConfigurationError: the role may not create the schema or the table,
            or what exists is not what it must be (named, with every finding).
    """
    trusted = trusted_roles(conn)
    problems = _create_and_check(conn, schema, REALTIME_OFFSETS, trusted, what=what, role="writer")
    if problems:
        raise _markers_refused(what, schema, trusted, problems)
    return sql.Identifier(schema, REALTIME_OFFSETS.name)


def vet_realtime_offsets(conn: psycopg.Connection[Any], schema: str, *, what: str) -> str:
    """Check the offset markers (they exist) and read their catalog facts in one snapshot.

    The facts (``catalog.RELATION_FACTS_SQL``'s line) are what the checks passed on:
    the JVM writer's tasks, which cannot run the checks, require the same line.

    Raises:
        ConfigurationError: the markers are refused (named, with every finding).
    """
    trusted = trusted_roles(conn)
    name = REALTIME_OFFSETS.name
    with conn.transaction():
        # One snapshot for the checks and the facts: a grant slipped in between would
        # otherwise be in the facts the tasks trust without having been checked.
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        problems = schema_problems(conn, schema, trusted)
        problems += _table_problems(conn, schema, REALTIME_OFFSETS, trusted)
        facts = relation_facts(conn, schema, name)
    if problems or facts is None:
        raise _markers_refused(what, schema, trusted, problems or [f"{schema}.{name} is gone"])
    return facts
