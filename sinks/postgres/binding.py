"""Start-up of a Postgres sink: connect, check the target, claim the fence row for a writer.

``PostgresSink.bind(writer)`` (called by ``CommitCycle.start()`` before it
claims a generation) runs these, so that a bad DSN, a wrong password, a
missing table, a server without prepared transactions, untrustworthy state
tables or another state's markers stop the pipeline at start-up, with a
message, instead of at the first epoch (or never).
"""

from __future__ import annotations

import logging
from typing import Any

import psycopg
from psycopg import errors

from reconcile.core.contract import ConfigurationError, ReconcileError, RetryableError
from sinks.objects.epoch_column import add_epoch_column

from .connection import PgTarget, connect_failure
from .markers import Fence, StateTables
from .ownership import Scope, check_fence, check_marker
from .schema import TableSchema, reflect_table

__all__ = ["claim_scope", "connect_checked", "open_target", "startup_failure"]

log = logging.getLogger("reconcile.sinks.postgres")


def connect_checked(target: PgTarget, what: str, app: str) -> psycopg.Connection[Any]:
    """An autocommit connection, or the start-up error that says why not.

    Raises:
        ConfigurationError: wrong password, no such role or database, refused
            by pg_hba.conf (retrying cannot help).
        RetryableError: the server is unreachable, starting or restarting.
    """
    try:
        return target.connect(autocommit=True, application_name=app)
    except psycopg.OperationalError as err:
        raise connect_failure(target, err, what) from None


def startup_failure(target: PgTarget, what: str, err: psycopg.Error) -> ReconcileError:
    """Sort a server error met during start-up (after connecting), password redacted."""
    text = target.redact(f"{what}: start-up check on {target.describe()} failed: {err}".strip())
    if isinstance(err, psycopg.OperationalError) and not isinstance(
        err, errors.InsufficientPrivilege
    ):
        return RetryableError(text)  # connection lost, timeout, server shutting down
    # Missing privileges, undefined objects, bad definitions: a retry meets them again.
    return ConfigurationError(text)


def open_target(
    conn: psycopg.Connection[Any],
    *,
    what: str,
    schema_name: str | None,
    table: str,
    key: tuple[str, ...] | None,
    append_only: bool,
    create_epoch_column: bool,
) -> TableSchema:
    """Reflect the target table (adding ``_epoch`` if asked) and check it can be written.

    Raises:
        ConfigurationError: the table is missing, has no usable key, or an
            append-only table is not keyed by one change-id column.
    """
    schema = reflect_table(conn, schema_name, table, key)
    if create_epoch_column and not schema.has_epoch_column:
        add_epoch_column(conn, schema, what)
        schema = reflect_table(conn, schema.schema, table, key)
    if append_only and len(schema.key) != 1:
        raise ConfigurationError(
            f"{what}: append-only table {schema.display} must be keyed by one change-id "
            f"column, not {list(schema.key)}"
        )
    return schema


def claim_scope(conn: psycopg.Connection[Any], state: StateTables, scope: Scope) -> Fence:
    """Create (or find) the fence row of (pipeline, sink) and check that it is this writer's.

    Also looks at the oldest and the newest marker of (pipeline, sink): if
    either was written by another progress log, every epoch would meet it, so
    the start-up fails now, naming it. Markers of the same log for another
    target are reported when their epoch is consulted (the sink's table may
    have been changed on purpose).

    Raises:
        MarkerMismatchError: the fence row or a marker belongs to another state.
    """
    fence = state.ensure(conn, scope.pipeline, scope.sink, scope.log_id)
    edges = state.edge_markers(conn, scope.pipeline, scope.sink)
    mismatch = check_fence(fence, scope, state, newest=edges[1])
    if mismatch is not None:
        raise mismatch
    for marker in edges:
        if marker is not None and marker.log_id != scope.log_id:
            found = check_marker(marker, scope, state, where="start-up")
            assert found is not None
            raise found
    return fence
