"""The staging tables: the executors' (one per pipeline, sink and target), a session's temp tables.

The executors' staging table lives with the sink's marker tables, in the
engine's schema, and is checked like them before a query uses it; a session's
temp table is qualified ``pg_temp`` and needs no check (only its session can
reach it).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import errors, sql

from reconcile.core.contract import ConfigurationError
from reconcile.core.staged import STAGE_EPOCH_COLUMN, STAGE_TASK_COLUMN, StageUnavailable

from .catalog import (
    relation_exists,
    relation_problems,
    revoke_relation,
    schema_problems,
    trusted_roles,
)
from .declared import (
    CREATE_SESSION_STAGE,
    CREATE_STAGE,
    CREATE_STAGE_INDEX,
    EPOCH_COLUMN,
    MAX_COLUMNS,
    SESSION_SCHEMA,
    STAGE_EXTRA_COLUMNS,
    session_stage_name,
    stage_columns,
    stage_name,
)
from .postgres import create_in_one_txn, locate_state_schema

if TYPE_CHECKING:  # sinks.postgres imports this package: no import of it at run time
    from sinks.postgres.schema import TableSchema

__all__ = ["StageUnavailable", "create_session_stage", "open_stage", "session_stage"]


def open_stage(
    conn: psycopg.Connection[Any],
    target: TableSchema,
    *,
    pipeline: str,
    sink: str,
    explicit_schema: str | None,
    state_owner: str | None,
    what: str,
) -> tuple[str, str]:
    """Find or create the executors' staging table of (pipeline, sink, target), check it.

    It lives with the sink's marker tables (``locate_state_schema``): owned by
    the sink's role, UNLOGGED, the target's columns (no ``_epoch``) plus the
    epoch and the task attempt, reachable by no other role.

    Returns:
        (schema, table) of the staging table.

    Raises:
        StageUnavailable: the target has too many columns for a staging
            table, the role may not create it, or what exists is not what it
            must be; the message says which and what to do.
    """
    staged = [(c, col.sql_type) for c, col in target.columns.items() if c != EPOCH_COLUMN]
    width = len(staged) + len(STAGE_EXTRA_COLUMNS)
    if width > MAX_COLUMNS:
        raise StageUnavailable(
            f"{what}: table {target.display} has {len(staged)} columns to stage; its staging "
            f"table would need {width}, over PostgreSQL's limit of {MAX_COLUMNS} columns a table",
            table=target.display,
        )
    try:
        schema = locate_state_schema(conn, explicit_schema, target.schema, what)
    except ConfigurationError as err:
        raise StageUnavailable(str(err), table=target.display) from None
    name = stage_name(pipeline, sink, (target.schema, target.table), staged)
    trusted = trusted_roles(conn, state_owner)
    problems = schema_problems(conn, schema, trusted)
    if not problems and not relation_exists(conn, schema, name):
        ident = sql.Identifier(schema, name)
        names = {
            "epoch": sql.Identifier(STAGE_EPOCH_COLUMN),
            "task": sql.Identifier(STAGE_TASK_COLUMN),
        }
        create = sql.SQL(CREATE_STAGE).format(
            table=ident,
            columns=sql.SQL(", ").join(sql.Identifier(c) for c, _ in staged),
            target=target.ident,
            **names,
        )
        index = sql.SQL(CREATE_STAGE_INDEX).format(
            index=sql.Identifier(f"{name}_task"), table=ident, **names
        )
        try:
            create_in_one_txn(
                conn, [create, index], functools.partial(revoke_relation, conn, schema, name)
            )
        except errors.InsufficientPrivilege as err:
            raise StageUnavailable(
                f"{what}: cannot create the staging table {schema}.{name}: {str(err).strip()}",
                table=target.display,
            ) from None
    if relation_exists(conn, schema, name):
        problems += relation_problems(
            conn,
            schema,
            name,
            columns=stage_columns(staged),
            key=(),
            persistence="u",
            trusted=trusted,
        )
    if problems:
        raise StageUnavailable(
            f"{what}: refusing to use the staging table {schema}.{name}: "
            + "; ".join(problems)
            + ". Its rows go into the target, so it must be the sink role's own "
            f"({trusted[0]}), unlogged, with the target's columns, and reachable by no other "
            "role. Drop it as its owner (it holds no committed rows)",
            table=target.display,
            problems=problems,
        )
    return schema, name


def session_stage(kind: str, target: TableSchema, columns: Sequence[str]) -> sql.Identifier:
    """A session's temp table for (target, columns), ``kind`` 'u' (upserts) or 'd' (deletes).

    Always qualified with ``pg_temp``: unqualified, a table of the same name in
    a schema listed before ``pg_temp`` on the ``search_path`` would receive the
    epoch's rows (and could feed rows of its own into the target). It needs no
    catalog check: only the session that created it can reach it (any other
    session, superusers too, gets "cannot access temporary tables of other
    sessions"), so neither another owner nor a grant can matter.
    """
    typed = [(c, target.columns[c].sql_type) for c in columns]
    name = session_stage_name(kind, (target.schema, target.table), typed)
    return sql.Identifier(SESSION_SCHEMA, name)


def create_session_stage(
    cur: psycopg.Cursor[Any], name: sql.Identifier, target: TableSchema, columns: Sequence[str]
) -> None:
    """Create the session's temp table ``name`` (from ``session_stage``) if missing."""
    # CREATE ... AS SELECT ... WITH NO DATA copies the column types but no
    # constraints.
    cur.execute(
        sql.SQL(CREATE_SESSION_STAGE).format(
            table=name,
            columns=sql.SQL(", ").join(map(sql.Identifier, columns)),
            target=target.ident,
        )
    )
