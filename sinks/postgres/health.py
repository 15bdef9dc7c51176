"""Database health: a pipeline's prepared txns (age, owner) and their settlement; marker retention.

A prepared transaction holds its locks and pins the VACUUM horizon of the
whole cluster until it is committed or rolled back. ``recover()`` lists only
the asking sink's own txns (the cycle decides those); a sink that was renamed
or removed leaves its txns behind, and nothing would ever end them. So:

- :func:`list_prepared` lists every prepared txn of a pipeline, all sinks, with
  its age; the sink logs a warning at start-up for any older than its
  ``prepared_warn_after_s`` (``reconcile status --pg`` shows them too);
- :func:`settle_prepared` ends the ones that no live writer will: txns of an
  older generation than the progress log's newest, decided by the log exactly
  as ``CommitCycle.start()`` decides them (``reconcile pg prepared --settle``);
- :func:`prune_markers` applies the marker retention rule (``reconcile pg prune``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg import errors, sql

from reconcile.core.contract import FatalError, SinkTxnId, TxnIdParseError
from reconcile.core.progress import EpochStatus, ProgressState

from .markers import FENCES_TABLE, MARKERS_TABLE, StateTables

__all__ = [
    "PreparedTxn",
    "Settlement",
    "find_state_schemas",
    "list_prepared",
    "prune_markers",
    "settle_prepared",
    "warn_old_prepared",
]

log = logging.getLogger("reconcile.sinks.postgres")

_PRUNE_BATCH = 10_000


@dataclass(frozen=True)
class PreparedTxn:
    """One prepared transaction of a pipeline, as pg_prepared_xacts shows it."""

    txn_id: SinkTxnId
    prepared_at: datetime
    age_s: float
    owner: str


@dataclass(frozen=True)
class Settlement:
    """What :func:`settle_prepared` did (or would do) with one prepared txn."""

    txn_id: SinkTxnId
    action: str  # "commit", "abort" or "leave"
    reason: str


def list_prepared(conn: psycopg.Connection[Any], pipeline: str) -> list[PreparedTxn]:
    """Every txn of ``pipeline`` (any sink) prepared in this database, oldest first."""
    found = []
    for gid, prepared, age, owner in conn.execute(
        "SELECT gid, prepared, extract(epoch FROM now() - prepared)::float8, owner "
        "FROM pg_prepared_xacts WHERE database = current_database() ORDER BY prepared"
    ):
        try:
            txn_id = SinkTxnId.from_string(gid)
        except TxnIdParseError:
            continue  # another application's prepared txn
        if txn_id.pipeline == pipeline:
            found.append(PreparedTxn(txn_id, prepared, float(age), str(owner)))
    return found


def warn_old_prepared(
    conn: psycopg.Connection[Any], pipeline: str, older_than_s: float, what: str
) -> list[PreparedTxn]:
    """Log a warning naming the pipeline's prepared txns older than ``older_than_s``."""
    old = [p for p in list_prepared(conn, pipeline) if p.age_s > older_than_s]
    if old:
        log.warning(
            "%s: %d prepared transaction(s) of pipeline %r are older than %.0fs and hold back "
            "VACUUM: %s. The cycle ends its own sinks' txns at start(); those of renamed or "
            "removed sinks end only with `reconcile pg prepared --settle`",
            what,
            len(old),
            pipeline,
            older_than_s,
            ", ".join(f"{p.txn_id} ({p.age_s:.0f}s)" for p in old),
        )
    return old


def find_state_schemas(conn: psycopg.Connection[Any]) -> list[str]:
    """Every schema of this database that holds a reconcile_commits table."""
    return [
        str(r[0])
        for r in conn.execute(
            "SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.relname = %s AND c.relkind = 'r' ORDER BY 1",
            (MARKERS_TABLE,),
        )
    ]


def _fence_log_ids(conn: psycopg.Connection[Any], pipeline: str) -> dict[str, set[str | None]]:
    """sink -> the log ids of its fence rows, over every state schema of the database."""
    owners: dict[str, set[str | None]] = {}
    for schema in find_state_schemas(conn):
        table = sql.Identifier(schema, FENCES_TABLE)
        exists = conn.execute("SELECT to_regclass(%s)", (table.as_string(conn),)).fetchone()
        if exists is None or exists[0] is None:
            continue
        for sink, log_id in conn.execute(
            sql.SQL("SELECT sink, log_id FROM {} WHERE pipeline = %s").format(table), (pipeline,)
        ):
            owners.setdefault(str(sink), set()).add(log_id)
    return owners


def settle_prepared(
    conn: psycopg.Connection[Any],
    progress: ProgressState,
    pipeline: str,
    *,
    committed: set[tuple[int, int]],
    apply: bool,
) -> list[Settlement]:
    """Commit or roll back the pipeline's prepared txns that no live writer will end.

    The rule, for each prepared txn of ``pipeline`` (any sink name):

    - its generation must be older than the progress log's newest generation:
      that writer is fenced and will never decide it; txns of the newest
      generation belong to the live writer and are left alone;
    - the sink's fence row must belong to this progress log (otherwise the
      txn is another state's, and it is left alone);
    - it is committed if its own generation passed the commit point of its
      epoch (the log holds "committed" for that epoch by that generation):
      what ``CommitCycle.start()`` would have done had the sink still been
      declared; left alone if the log no longer knows the epoch (truncated:
      pull-and-diff decides); rolled back otherwise (that attempt never
      reached the commit point, even if a later one did).

    Args:
        conn: an autocommit connection to the sink database.
        progress: the pipeline's progress log state (``read_progress``).
        pipeline: the pipeline's name.
        committed: every (epoch, generation) that the log records as having
            reached COMMITTED.
        apply: False only reports what would be done.

    Raises:
        FatalError: the progress log has no identity (an old log).
    """
    if progress.log_id is None:
        raise FatalError(f"progress log of pipeline {pipeline!r} has no identity entry")
    owners = _fence_log_ids(conn, pipeline)
    done = []
    for prepared in list_prepared(conn, pipeline):
        txn = prepared.txn_id
        status = progress.status_of(txn.epoch)
        if txn.generation >= progress.generation:
            action, reason = "leave", "prepared by the live writer's generation"
        elif owners.get(txn.sink) != {progress.log_id}:
            action, reason = (
                "leave",
                f"sink {txn.sink!r}'s fence row belongs to "
                f"{sorted(map(str, owners.get(txn.sink, set())))}, not to this progress log",
            )
        elif (txn.epoch, txn.generation) in committed:
            action, reason = (
                "commit",
                (f"generation {txn.generation} committed epoch {txn.epoch} in the progress log"),
            )
        elif status is EpochStatus.UNKNOWN:
            action, reason = "leave", f"epoch {txn.epoch} is truncated from the log: pull-and-diff"
        else:
            action, reason = (
                "abort",
                (
                    f"generation {txn.generation} never committed epoch {txn.epoch} (the epoch is "
                    f"{status.value if status else 'unrecorded'} in the log)"
                ),
            )
        if apply and action != "leave":
            verb = "COMMIT PREPARED" if action == "commit" else "ROLLBACK PREPARED"
            try:
                conn.execute(sql.SQL(verb + " {}").format(sql.Literal(str(txn))))
            except errors.UndefinedObject:
                reason += " (already ended by someone else)"
        done.append(Settlement(txn, action, reason))
    return done


def prune_markers(
    conn: psycopg.Connection[Any],
    state: StateTables,
    progress: ProgressState,
    pipeline: str,
    *,
    keep_epochs: int,
    apply: bool,
) -> tuple[int | None, int]:
    """Delete the markers that neither resolution nor a restart can need any more.

    The rule: a marker of this progress log whose epoch is below
    ``min(newest FINALIZED epoch + 1, oldest COMMITTED epoch) - keep_epochs``.
    An ambiguous COMMIT asks only for the epoch in flight; a restart settles
    COMMITTED (not yet finalized) epochs by their markers; the cycle never runs
    an epoch below the newest committed one. The newest markers are kept
    (``keep_epochs`` >= 1) because pull-and-diff starts from them, and every
    fence row is kept: it is what still tells another state's run apart after
    its markers are gone. Markers of other progress logs are never deleted
    here: they are evidence of a mismatch for an operator.

    Returns:
        (the epoch below which markers go, or None if nothing may go; how
        many markers were deleted, or would be without ``apply``).

    Raises:
        FatalError: ``keep_epochs`` < 1, or the log has no identity.
    """
    if keep_epochs < 1:
        raise FatalError(f"keep_epochs must be >= 1, got {keep_epochs}")
    if progress.log_id is None:
        raise FatalError(f"progress log of pipeline {pipeline!r} has no identity entry")
    finalized = progress.epochs_in(EpochStatus.FINALIZED)
    if not finalized:
        return None, 0
    limits = [finalized[-1] + 1, *progress.epochs_in(EpochStatus.COMMITTED)]
    below = min(limits) - keep_epochs
    if below <= 0:
        return None, 0
    where = sql.SQL("pipeline = %(p)s AND log_id = %(l)s AND epoch < %(b)s")
    params = {"p": pipeline, "l": progress.log_id, "b": below}
    if not apply:
        row = conn.execute(
            sql.SQL("SELECT count(*) FROM {} WHERE {}").format(state.markers, where), params
        ).fetchone()
        return below, int(row[0]) if row else 0
    deleted = 0
    while True:
        # Small batches, each its own transaction: no long lock, no huge WAL burst.
        cur = conn.execute(
            sql.SQL(
                "DELETE FROM {0} WHERE ctid = ANY(ARRAY(SELECT ctid FROM {0} WHERE {1} LIMIT {2}))"
            ).format(state.markers, where, sql.Literal(_PRUNE_BATCH)),
            params,
        )
        deleted += cur.rowcount
        if cur.rowcount < _PRUNE_BATCH:
            return below, deleted
