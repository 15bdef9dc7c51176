"""Applying a pull-and-diff repair to a Postgres sink: ONE transaction with its marker.

The transaction, in order:

1. record ``pg_current_xact_id()`` (the xid) and raise ``synchronous_commit``;
2. lock the fence row (waiting for any epoch txn of the pipeline to end) and
   check the writer: a given generation must not be fenced off (a newer one
   raises the fence, as an epoch would); without one (an operator's repair) it
   acts for the writer the fence names;
3. re-read the sink's newest marker: if an epoch committed since the pull, the
   diff is stale, so roll back and let the caller pull again;
4. delete the extra keys, upsert the missing and changed rows (the sink's own
   COPY path, with ``_epoch`` = the target epoch);
5. insert the markers of every epoch up to the target that has none, and one
   row in ``reconcile_repairs`` (the repair's counts and xid, which also
   records a repair of an epoch whose marker existed already);
6. COMMIT; a COMMIT without reply is settled like an epoch's (``resolve.py``),
   by ``pg_xact_status`` and then the ``reconcile_repairs`` row of our xid.

A repair killed anywhere before its COMMIT leaves nothing: it is one
transaction. Run again, it pulls again and finishes.

SIGINT or SIGTERM (``reconcile.core.interrupts``) before the COMMIT rolls the
transaction back; a statement they interrupt is cancelled on the server
(psycopg cancels the statement it waits for on a KeyboardInterrupt, which
the interruption is). The COMMIT is the commit point: once it is sent, an
interruption reports the repair as in doubt, never as not written.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

import psycopg
import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
from psycopg import sql

from reconcile.core import hooks, interrupts
from reconcile.core.contract import (
    Change,
    Fatal,
    FencedError,
    InvalidInputError,
    RetryableError,
    SinkTxnId,
)
from reconcile.core.target import Repair

from .apply import apply_with_copy
from .client import PgSinkClient
from .markers import SYNC_COMMIT_AT_LEAST_ON, Fence
from .replication import watched
from .resolve import InFlightTxn, Resolution, resolve_commit
from .session import classify_failure
from .staging import EpochBatch, validate_batch

__all__ = ["REPAIR_APPLIED", "REPAIR_COMMITTED", "REPAIR_LOCKED", "apply_repair"]

log = logging.getLogger("reconcile.recovery")

# Inside the repair txn, after the fence row is locked and the newest marker
# re-read, before any row is written: an epoch that commits here cannot exist
# (it waits for the lock), which is what a test puts to the proof.
REPAIR_LOCKED = hooks.declare("pg.repair.locked")
# Inside the repair txn after every row, marker and the repairs row are
# written, before COMMIT: a kill here must leave nothing of the repair.
REPAIR_APPLIED = hooks.declare("pg.repair.applied")
# After the repair's COMMIT returned and its session was released.
REPAIR_COMMITTED = hooks.declare("pg.repair.committed")


def _rows_for_copy(table: pa.Table) -> pa.Table | list[dict[str, Any]]:
    """Arrow rows where the sink's Arrow path takes them, else dict rows.

    The sink's Arrow path refuses binary columns (bytea, and a uuid kept as 16
    bytes); a repair is divergence-sized, so dict rows cost little there.
    """
    binary = [
        f.name
        for f in table.schema
        if pa.types.is_binary(f.type)
        or pa.types.is_large_binary(f.type)
        or pa.types.is_fixed_size_binary(f.type)
    ]
    if not binary:
        return table
    rows = table.to_pylist()
    for f in table.schema:
        if pa.types.is_fixed_size_binary(f.type) and f.type.byte_width == 16:
            for row in rows:
                if row[f.name] is not None:
                    row[f.name] = uuid.UUID(bytes=row[f.name])
    return rows


def _lock_fence(
    cur: psycopg.Cursor[Any], sink: PgSinkClient, pipeline: str
) -> tuple[str, Fence | None]:
    state = sink._state
    assert state is not None
    row = cur.execute(
        sql.SQL(
            "WITH fence AS (SELECT generation, log_id, updated_at FROM {fences} "
            " WHERE pipeline = %(p)s AND sink = %(s)s FOR UPDATE) "
            "SELECT pg_current_xact_id()::text, {durable}, f.generation, f.log_id, f.updated_at "
            "FROM (SELECT 1) one LEFT JOIN fence f ON true"
        ).format(
            fences=state.fences, durable=sql.SQL(SYNC_COMMIT_AT_LEAST_ON.format(local="true"))
        ),
        {"p": pipeline, "s": sink.name},
    ).fetchone()
    assert row is not None
    return str(row[0]), (None if row[2] is None else Fence(int(row[2]), row[3], row[4]))


def _newest(cur: psycopg.Cursor[Any], sink: PgSinkClient, pipeline: str) -> int | None:
    # A statement of its own, after the lock: in READ COMMITTED it takes a new
    # snapshot, which sees every epoch that committed while we waited for the lock.
    assert sink._state is not None
    row = cur.execute(
        sql.SQL("SELECT max(epoch) FROM {} WHERE pipeline = %s AND sink = %s").format(
            sink._state.markers
        ),
        (pipeline, sink.name),
    ).fetchone()
    return None if row is None or row[0] is None else int(row[0])


def _write_rows(cur: psycopg.Cursor[Any], sink: PgSinkClient, repair: Repair) -> int:
    schema = sink.setup()
    if not repair.upserts.num_rows and not repair.deletes.num_rows:
        return 0
    batch = EpochBatch()
    if repair.upserts.num_rows:
        batch.add(_rows_for_copy(repair.upserts), id_column=None)
    keys = list(schema.key)
    batch.add(
        [Change("delete", row) for row in repair.deletes.select(keys).to_pylist()], id_column=None
    )
    validated = validate_batch(schema, batch, sink=sink.name, epoch=repair.target_epoch)
    apply_with_copy(cur, schema, validated, repair.target_epoch, append_only=False)
    return validated.row_count


def _markers(
    cur: psycopg.Cursor[Any],
    sink: PgSinkClient,
    pipeline: str,
    newest: int | None,
    repair: Repair,
    owner: tuple[str | None, int],
    applied: int,
) -> int:
    """Insert the markers of the epochs up to the target that have none; how many."""
    target = repair.target_epoch
    if newest is not None and newest >= target:
        return 0
    # Every epoch after the newest marker is in the sink once the repair commits
    # (it holds the state as of the target): a marker says so, so that no replay
    # of such an epoch writes its older rows over the repaired ones. A sink with
    # no marker at all gets the target's only.
    first = target if newest is None else newest + 1
    schema = sink.setup()
    assert sink._state is not None
    cur.execute(
        sql.SQL(
            "INSERT INTO {} (pipeline, sink, epoch, target_schema, target_table, log_id, xid, "
            "backend_pid, generation, row_count) "
            "SELECT %s, %s, e, %s, %s, %s, pg_current_xact_id(), pg_backend_pid(), %s, "
            "CASE WHEN e = %s::bigint THEN %s::bigint ELSE 0 END "
            "FROM pg_catalog.generate_series(%s::bigint, %s::bigint) AS e"
        ).format(sink._state.markers),
        (pipeline, sink.name, schema.schema, schema.table, owner[0], owner[1], target, applied,
         first, target),
    )  # fmt: skip
    return target - first + 1


def apply_repair(
    sink: PgSinkClient, pipeline: str, repair: Repair, generation: int | None
) -> int | None:
    """Apply ``repair`` to ``sink``'s table in one transaction with its marker.

    Args:
        sink: a Postgres sink client (bound to the pipeline's writer, or used
            directly by an operator's repair).
        pipeline: whose markers and fence row.
        repair: what to write and the target epoch.
        generation: the writer generation to check against the fence (the
            commit cycle's); None acts for the writer that the fence names.

    Returns:
        Rows written or deleted; None if an epoch committed since the pull
        (nothing was written).

    Raises:
        FencedError: a newer writer generation holds the fence.
        MarkerMismatchError: the fence belongs to another progress log.
        InvalidInputError: the target epoch is older than the sink's newest
            marker, or the rows do not fit the table; nothing was written.
        OutcomeUnknownError: the COMMIT had no reply and nothing settles it.
        RetryableError: the transaction failed or did not take effect.
    """
    sink.setup()
    state = sink._state
    assert state is not None
    session = sink._session()
    conn = session.conn
    target = repair.target_epoch
    try:
        with conn.cursor() as cur:
            xid, fence = _lock_fence(cur, sink, pipeline)
            newest = _newest(cur, sink, pipeline)
            hooks.point(REPAIR_LOCKED)
            if newest != repair.seen_newest:
                sink._rollback_quietly(session)
                log.info(
                    "repair of %s: the newest marker moved from %s to %s since the pull; "
                    "pulling again",
                    sink.name,
                    repair.seen_newest,
                    newest,
                )
                return None
            if newest is not None and target < newest:
                raise InvalidInputError(
                    f"postgres sink {sink.name!r}: cannot repair to epoch {target}, older than "
                    f"the sink's newest marker (epoch {newest}); nothing was written",
                    epoch=target,
                    newest=newest,
                )
            if generation is not None:
                fenced = sink._check_fence(cur, SinkTxnId(pipeline, sink.name, target, generation),
                                           fence)  # fmt: skip
                if isinstance(fenced, Fatal):
                    raise fenced.error or FencedError(fenced.reason)
                owner: tuple[str | None, int] | None = (
                    sink._scope(pipeline).log_id,
                    generation,
                )
            else:
                # An operator's repair writes markers for the writer that owns
                # the sink; a sink no writer ever claimed gets none, so that its
                # first pipeline is not refused for another log's markers.
                owner = None if fence is None else (fence.log_id, fence.generation)
            applied = _write_rows(cur, sink, repair)
            markers = (
                0
                if owner is None
                else _markers(cur, sink, pipeline, newest, repair, owner, applied)
            )
            if not applied and not markers:
                sink._rollback_quietly(session)
                return 0
            who = owner or (None, 0)
            schema = sink.setup()
            cur.execute(
                sql.SQL(
                    "INSERT INTO {} (pipeline, sink, xid, epoch, target_schema, target_table, "
                    "log_id, backend_pid, generation, mode, missing, extra, changed, applied) "
                    "VALUES (%s, %s, pg_current_xact_id(), %s, %s, %s, %s, pg_backend_pid(), "
                    "%s, %s, %s, %s, %s, %s)"
                ).format(state.repairs),
                (pipeline, sink.name, target, schema.schema, schema.table, who[0], who[1],
                 repair.mode, repair.counts.get("missing", 0), repair.counts.get("extra", 0),
                 repair.counts.get("changed", 0), applied),
            )  # fmt: skip
            hooks.point(REPAIR_APPLIED)
        # The last moment to roll back: a signal received since the transaction
        # began whose exception something swallowed on its way up stops the
        # COMMIT here (the handler recorded it).
        interrupts.check()
    except psycopg.Error as err:
        sink._rollback_quietly(session)
        message = sink.target.redact(
            f"postgres sink {sink.name!r}: repair of {sink.setup().display} failed: {err}; "
            "nothing was written"
        )
        # The same sorting as an epoch's: a row the database refuses (a
        # constraint, a value, a privilege) is refused again by every retry,
        # so it stops the caller (a takeover would otherwise step down and
        # take over again for ever); the rest may pass on a retry.
        outcome = classify_failure(
            message, err, epoch=target, table=sink.setup().display, sink=sink.name
        )
        if outcome.kind == "fatal" and outcome.error is not None:
            raise outcome.error from None
        raise RetryableError(message) from None
    except BaseException:
        sink._rollback_quietly(session)
        raise
    _commit(sink, session, pipeline, target, xid)
    return applied


def _commit(sink: PgSinkClient, session: Any, pipeline: str, target: int, xid: str) -> None:
    """COMMIT the repair; a COMMIT without reply is asked from the database."""
    state = sink._state
    assert state is not None
    # From here until its reply is read, whether the repair was written is in doubt.
    point = interrupts.commit_point(f"the repair of {sink.setup().display}")
    try:
        with (
            interrupts.step("the COMMIT of the repair"),
            watched(session.conn, sink.options.commit_timeout_s),
        ):
            session.conn.commit()
    except psycopg.Error as err:
        session.conn.close()
        log.warning("%s", sink.target.redact(f"repair COMMIT of {sink.name!r} failed: {err}"))

        def ours(conn: psycopg.Connection[Any]) -> tuple[bool, bool]:
            # The repairs row carries our xid and commits exactly with the repair.
            row = conn.execute(
                sql.SQL(
                    "SELECT 1 FROM {} WHERE pipeline = %s AND sink = %s AND xid = %s::xid8"
                ).format(state.repairs),
                (pipeline, sink.name, xid),
            ).fetchone()
            return row is not None, row is not None

        resolved = resolve_commit(
            sink.target,
            state,
            InFlightTxn(SinkTxnId(pipeline, sink.name, target, 0), xid, session.backend),
            scope=sink._scope(pipeline),
            timeout=sink.options.resolve_timeout_s,
            app=sink.application_name,
            evidence=ours,
        )
        if resolved.resolution is not Resolution.COMMITTED:
            point.aborted()
            raise RetryableError(
                f"postgres sink {sink.name!r}: the repair's COMMIT did not take effect "
                f"({resolved.decided_by.value}: {resolved.detail}); run it again"
            ) from None
        point.committed()
        return
    except BaseException:
        # Interrupted while the COMMIT was on its way (psycopg cancelled it and
        # read its reply, which the interruption leaves unread): in doubt, as
        # the commit point says. The session is not used again.
        session.conn.close()
        raise
    point.committed()
    sink._release(session)
    hooks.point(REPAIR_COMMITTED)
