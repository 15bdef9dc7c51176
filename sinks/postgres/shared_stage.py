"""A staging table of the sink's own, filled by Spark executors, read by the epoch txn.

The streaming writer's executors COPY their partition's rows (netted: one per
key) into the staging table of (pipeline, sink, target),
``reconcile._reconcile_stage_<digest>`` (declared, created and checked in
``sinks.objects``): an UNLOGGED table with the target's columns plus the
epoch and the task attempt that wrote each row; each executor commits its own
COPY. The driver's epoch txn then takes exactly the rows of the attempts Spark
kept:

    INSERT INTO target (...) SELECT ... FROM stage
     WHERE _reconcile_epoch = $epoch AND _reconcile_task = ANY($tasks)
    ON CONFLICT (key) DO UPDATE ...

and writes the marker in the same txn, so the rows and the marker commit
together or not at all, and no row of the epoch passes through the driver.

Why this is safe:
- nobody else can read or change a staged row. The table is the sink role's
  own, in the engine's schema, on which no other role has USAGE or CREATE;
  every privilege default privileges gave another role is revoked in the
  transaction that creates it; and before the writer uses it, the catalog is
  checked for exactly that (owner, kind, columns, no triggers, rules,
  row-level security or grants to anyone else). Only the sink's role, a
  trusted ``state_owner`` and superusers can touch it, and each of them could
  write the target directly. This matters because the row count below cannot
  see a changed value: an UPDATE of a staged row between the COPY and the
  INSERT keeps the count;
- it is one pipeline's and one sink's: another pipeline writing the same
  target has a table of its own, so no sweep of another writer deletes rows
  this epoch needs;
- an attempt that failed or was superseded (a retried or speculative task)
  may have committed its COPY, but its task id is not in ``tasks``: it is never
  read, and the sweep deletes it;
- the upsert's row count must equal what the kept attempts reported: rows
  that went missing (a zombie writer of the same pipeline sweeping, a server
  crash emptying the UNLOGGED table) stop the epoch instead of committing
  fewer rows;
- UNLOGGED: a server crash empties the table, so a batch staged before it
  fails the count check and Spark's retry of the batch stages it again; the
  rows are never in the target until the epoch txn commits, so nothing else
  depends on them surviving a crash, and no WAL is written for them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import psycopg
import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
from psycopg import sql

from reconcile.core.contract import FatalError, RetryableError
from reconcile.core.staged import STAGE_EPOCH_COLUMN, STAGE_TASK_COLUMN, StagedEpoch
from sinks.objects.stages import open_stage

from .apply import _copy_arrow, _target_columns, _upsert_tail
from .arrow_types import target_arrow_schema
from .connection import PgTarget
from .schema import TableSchema, reflect_table

if TYPE_CHECKING:
    from .client import PgSinkClient

__all__ = [
    "PgSharedStage",
    "PgStageTarget",
    "apply_staged",
    "copy_to_stage",
    "ensure_stage",
    "reflect_target",
    "sweep_stage",
]


@dataclass(frozen=True)
class PgSharedStage:
    """The staging table of one (pipeline, sink, target), as the executors' tasks carry it.

    It pickles into every task: the target holds the password, which never
    shows in its repr.
    """

    target: PgTarget = field(repr=False)
    table: tuple[str, str]

    def copy(self, epoch: int, task: str, rows: pa.Table) -> None:
        """On an executor: COPY a task attempt's rows into the staging table, and commit."""
        copy_to_stage(self.target, self.table, epoch, task, rows)

    def sweep(self, through_epoch: int, application_name: str) -> int:
        """Delete the staging rows of epochs up to ``through_epoch`` (done, or abandoned)."""
        return sweep_stage(self.target, self.table, through_epoch, application_name)


@dataclass(frozen=True)
class PgStageTarget:
    """A Postgres sink's target as the streaming writer plans its executor path."""

    client: PgSinkClient = field(repr=False)
    schema: TableSchema

    @property
    def display(self) -> str:
        """The table's name in messages."""
        return self.schema.display

    @property
    def key(self) -> tuple[str, ...]:
        """Its key columns."""
        return tuple(self.schema.key)

    @property
    def columns(self) -> tuple[str, ...]:
        """Its column names."""
        return tuple(self.schema.columns)

    def arrow_schema(self) -> pa.Schema:
        """Its columns as the expected state records them (as the bound sink says them)."""
        return target_arrow_schema(self.schema)

    def open_stage(self, pipeline: str) -> PgSharedStage:
        """The staging table of (``pipeline``, the sink, this table), created and checked.

        Raises:
            StageUnavailable: it cannot be used safely (the message says why).
        """
        return PgSharedStage(self.client.target, ensure_stage(self.client, self.schema, pipeline))


def reflect_target(client: Any) -> TableSchema:
    """A sink client's target, read from the catalog without binding the client.

    The writer plans a batch before the commit cycle has bound its sinks
    (``bind`` must come first for a client of the cycle), so it reads the
    table on a connection of its own; the sink checks it again when bound.
    """
    try:
        with client.target.connect(autocommit=True, application_name=client.application_name) as c:
            key = client.options.key_columns or None
            return reflect_table(c, client.options.schema, client.table, key)
    except psycopg.OperationalError as err:
        raise _transient(client, "reading the target", err) from None


def ensure_stage(client: PgSinkClient, table: TableSchema, pipeline: str) -> tuple[str, str]:
    """The staging table of (``pipeline``, the client's sink, ``table``), created, checked.

    Returns:
        (schema, table) of the staging table.

    Raises:
        StageUnavailable: it cannot be used safely (too many columns, no
            privilege to create it, or an existing one is not the sink's own);
            the message says why. The driver path is still open.
    """
    try:
        with client.target.connect(autocommit=True, application_name=client.application_name) as c:
            return open_stage(
                c,
                table,
                pipeline=pipeline,
                sink=client.name,
                explicit_schema=client.options.state_schema,
                state_owner=client.options.state_owner,
                what=f"postgres sink {client.name!r} of pipeline {pipeline!r}",
            )
    except psycopg.OperationalError as err:
        raise _transient(client, "opening the staging table", err) from None


def _transient(client: PgSinkClient, doing: str, err: psycopg.Error) -> RetryableError:
    """A dropped connection or a server restarting while a batch is planned: try again."""
    return RetryableError(
        client.target.redact(
            f"postgres sink {client.name!r}: {doing} on {client.target.describe()} failed: "
            f"{str(err).strip()}"
        )
    )


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
