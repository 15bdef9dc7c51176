"""A staging table next to the target, filled by Spark executors, read by the epoch txn.

The streaming writer's executors COPY their partition's rows (netted: one per
key) into ``<schema>._reconcile_stage_<digest>``, an UNLOGGED table with the
target's columns plus the epoch and the task attempt that wrote each row; each
executor commits its own COPY. The driver's epoch txn then takes exactly the
rows of the attempts Spark kept:

    INSERT INTO target (...) SELECT ... FROM stage
     WHERE _reconcile_epoch = $epoch AND _reconcile_task = ANY($tasks)
    ON CONFLICT (key) DO UPDATE ...

and writes the marker in the same txn, so the rows and the marker commit
together or not at all, and no row of the epoch passes through the driver.

Why this is safe:
- an attempt that failed or was superseded (a retried or speculative task)
  may have committed its COPY, but its task id is not in ``tasks``: it is never
  read, and the sweep deletes it;
- the upsert's row count must equal what the kept attempts reported: a
  staging row that went missing (a sweep by someone else, a truncate) stops
  the epoch instead of committing fewer rows;
- UNLOGGED: a server crash empties the table, so a batch staged before it
  fails the count check and Spark's retry of the batch stages it again; the
  rows are never in the target until the epoch txn commits, so nothing else
  depends on them surviving a crash, and no WAL is written for them.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import psycopg
import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
from psycopg import errors, sql

from reconcile.contract import FatalError
from reconcile.staged import STAGE_EPOCH_COLUMN, STAGE_TASK_COLUMN, StagedEpoch

from .apply import _copy_arrow, _target_columns, _upsert_tail
from .connection import PgTarget
from .schema import EPOCH_COLUMN, TableSchema, reflect_table

__all__ = [
    "apply_staged",
    "copy_to_stage",
    "ensure_stage",
    "reflect_target",
    "stage_of",
    "sweep_stage",
]


def stage_of(schema: TableSchema) -> tuple[str, str]:
    """(schema, table) of the staging table of ``schema``'s target.

    The name carries a digest of the target's columns and types, so that a
    target whose columns changed gets a new staging table, never a stale one.
    """
    columns = [f"{c}:{col.sql_type}" for c, col in schema.columns.items() if c != EPOCH_COLUMN]
    digest = hashlib.blake2b(
        "\x1f".join([schema.schema, schema.table, *columns]).encode(), digest_size=8
    ).hexdigest()
    return schema.schema, f"_reconcile_stage_{digest}"


def reflect_target(client: Any) -> TableSchema:
    """A sink client's target, read from the catalog without binding the client.

    The writer plans a batch before the commit cycle has bound its sinks
    (``bind`` must come first for a client of the cycle), so it reads the
    table on a connection of its own; the sink checks it again when bound.
    """
    with client.target.connect(autocommit=True, application_name=client.application_name) as c:
        key = tuple(client.key) if client.key else None
        return reflect_table(c, client.schema_name, client.table, key)


def ensure_stage(target: PgTarget, schema: TableSchema, application_name: str) -> tuple[str, str]:
    """Create the staging table of ``schema``'s target if it does not exist; return its name."""
    where = stage_of(schema)
    columns = [c for c in schema.columns if c != EPOCH_COLUMN]
    create = sql.SQL(
        "CREATE UNLOGGED TABLE IF NOT EXISTS {} AS SELECT {}, NULL::bigint AS {}, "
        "NULL::text AS {} FROM {} WITH NO DATA"
    ).format(
        sql.Identifier(*where),
        sql.SQL(", ").join(map(sql.Identifier, columns)),
        sql.Identifier(STAGE_EPOCH_COLUMN),
        sql.Identifier(STAGE_TASK_COLUMN),
        schema.ident,
    )
    index = sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} ({}, {})").format(
        sql.Identifier(f"{where[1]}_task"),
        sql.Identifier(*where),
        sql.Identifier(STAGE_EPOCH_COLUMN),
        sql.Identifier(STAGE_TASK_COLUMN),
    )
    with target.connect(autocommit=True, application_name=application_name) as conn:
        for statement in (create, index):
            # A concurrent creator may win: IF NOT EXISTS is not atomic in Postgres.
            with contextlib.suppress(errors.UniqueViolation, errors.DuplicateTable):
                conn.execute(statement)
    return where


def copy_to_stage(
    target: PgTarget, stage: tuple[str, str], epoch: int, task: str, rows: pa.Table
) -> None:
    """On an executor: COPY a task attempt's rows into the staging table, and commit.

    The sink's own COPY path (CSV written by Arrow one bounded slice at a
    time): the task never holds its partition's CSV whole.
    """
    data = rows.append_column(
        STAGE_EPOCH_COLUMN, pa.array(np.full(rows.num_rows, epoch, dtype=np.int64))
    ).append_column(STAGE_TASK_COLUMN, pa.array([task] * rows.num_rows, pa.string()))
    with target.connect(application_name="reconcile-stage") as conn, conn.cursor() as cur:
        _copy_arrow(cur, sql.Identifier(*stage), data)
        conn.commit()


def apply_staged(
    cur: psycopg.Cursor[Any],
    schema: TableSchema,
    staged: StagedEpoch,
    columns: Sequence[str],
    epoch: int,
    *,
    append_only: bool,
) -> None:
    """Inside the epoch txn: upsert the kept attempts' rows from the staging table.

    Raises:
        FatalError: the staging table holds another number of rows for those
            attempts than they reported; nothing of the epoch is applied (the
            caller's txn is rolled back).
    """
    cols = tuple(columns)
    select: list[sql.Composable] = [sql.Identifier("s", c) for c in cols]
    if schema.has_epoch_column:
        select.append(sql.SQL("%(epoch)s::bigint"))
    query = sql.SQL(
        "INSERT INTO {} ({}) SELECT {} FROM {} AS s "
        "WHERE s.{} = %(epoch)s AND s.{} = ANY(%(tasks)s)"
    ).format(
        schema.ident,
        _target_columns(schema, cols),
        sql.SQL(", ").join(select),
        sql.Identifier(*staged.stage),
        sql.Identifier(STAGE_EPOCH_COLUMN),
        sql.Identifier(STAGE_TASK_COLUMN),
    ) + _upsert_tail(schema, cols, append_only)
    cur.execute(query, {"epoch": epoch, "tasks": list(staged.tasks)})
    if not append_only and cur.rowcount != staged.rows:
        # ON CONFLICT DO UPDATE counts every row, inserted or updated: any
        # other number means the staging table lost or gained rows of these
        # attempts since they reported. (DO NOTHING skips existing ids, so an
        # append-only target cannot be counted this way.)
        raise FatalError(
            f"table {schema.display}, epoch {epoch}: the staging table "
            f"{'.'.join(staged.stage)} holds {cur.rowcount} rows of the epoch's task "
            f"attempts, they staged {staged.rows}; nothing of the epoch was applied",
            epoch=epoch,
        )


def sweep_stage(
    target: PgTarget, stage: tuple[str, str], through_epoch: int, application_name: str
) -> int:
    """Delete the staging rows of epochs up to ``through_epoch`` (done, or abandoned)."""
    with target.connect(autocommit=True, application_name=application_name) as conn:
        cur = conn.execute(
            sql.SQL("DELETE FROM {} WHERE {} <= %s").format(
                sql.Identifier(*stage), sql.Identifier(STAGE_EPOCH_COLUMN)
            ),
            (through_epoch,),
        )
        return cur.rowcount
