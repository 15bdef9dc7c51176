"""Whose marker is it: a marker or fence row of another target or progress log is an error.

A marker row says "epoch N of (pipeline, sink) is committed". It is evidence
only for the writer that wrote it: the same target table and the same progress
log. A marker of a smoke run into another table under the same names, or of a
run whose state folder was wiped and recreated, must never make the sink answer
"already committed" (which would skip the epoch silently). Every place that
consults a marker or the fence row compares it with the writer's :class:`Scope`
here and turns a mismatch into a MarkerMismatchError that says what was found
and what to do.

A marker of this writer's own log and target is believed only as far as the
store decided (``reconcile.core.claims``): ``Scope.decisions`` is asked about
it, and a marker claiming an epoch the store has not decided (or naming a
generation it never granted) is an UntrustedRecordError, never "committed".
"""

from __future__ import annotations

from dataclasses import dataclass, field

from psycopg import sql

from reconcile.core.claims import Claim, Decisions, check_claim
from reconcile.core.contract import MarkerMismatchError

from .markers import FENCES_TABLE, MARKERS_TABLE, Fence, Marker, StateTables

__all__ = ["Scope", "check_fence", "check_marker", "describe_log"]


@dataclass(frozen=True)
class Scope:
    """What a sink writes and for whom: the identity its markers must carry."""

    pipeline: str
    sink: str
    target_schema: str
    target_table: str
    log_id: str | None  # None: the sink is not bound to a progress log (used directly)
    # What the store decided (the bound writer's), which a marker is held to.
    decisions: Decisions | None = field(default=None, compare=False, repr=False)

    @property
    def target(self) -> str:
        return f"{self.target_schema}.{self.target_table}"


def describe_log(log_id: str | None) -> str:
    """A log id as it reads in a message."""
    if log_id is None:
        return "no progress log (a sink used directly, without a commit cycle)"
    return f"progress log {log_id!r}"


def _literal(value: object) -> str:
    return sql.Literal(value).as_string(None)


def _delete_sql(state: StateTables, scope: Scope, log_id: str | None) -> str:
    """The statements that retire another log's markers and fence of (pipeline, sink)."""
    who = f"pipeline = {_literal(scope.pipeline)} AND sink = {_literal(scope.sink)} AND " + (
        "log_id IS NULL" if log_id is None else f"log_id = {_literal(log_id)}"
    )
    return (
        f"DELETE FROM {state.display(MARKERS_TABLE)} WHERE {who}; "
        f"DELETE FROM {state.display(FENCES_TABLE)} WHERE {who};"
    )


def check_marker(
    marker: Marker, scope: Scope, state: StateTables, *, where: str
) -> MarkerMismatchError | None:
    """None if ``marker`` was written for this target by this writer's progress log.

    Args:
        marker: the marker row found for the epoch.
        scope: the writer that asks.
        state: where the marker table lives (for the message's SQL).
        where: what was being done, e.g. "prepare" or "commit", for the message.
    """
    same_log = marker.log_id == scope.log_id
    same_target = (marker.target_schema, marker.target_table) == (
        scope.target_schema,
        scope.target_table,
    )
    if same_log and same_target:
        # Ours by its columns, which anyone who can insert a row can copy.
        claim = Claim(
            sink=scope.sink,
            what=f"postgres sink {scope.sink!r} of pipeline {scope.pipeline!r}",
            record=f"the marker of epoch {marker.epoch} in {state.display(MARKERS_TABLE)} "
            f"(xid {marker.xid}, committed at {marker.committed_at})",
            kind="commit",
            epoch=marker.epoch,
            generation=marker.generation,
        )
        return check_claim(claim, scope.decisions)
    found = (
        f"written for table {marker.target} by {describe_log(marker.log_id)} (generation "
        f"{marker.generation}, xid {marker.xid}, committed at {marker.committed_at})"
    )
    head = (
        f"postgres sink {scope.sink!r} of pipeline {scope.pipeline!r}, {where} of epoch "
        f"{marker.epoch}: {state.display(MARKERS_TABLE)} already holds a marker for this "
        f"epoch, {found}; this pipeline writes table {scope.target} with "
        f"{describe_log(scope.log_id)}. The epoch is NOT treated as committed and nothing "
        "was written. "
    )
    if same_log:
        advice = (
            "The same progress log committed this epoch into another table: the sink's table "
            f"was changed after epoch {marker.epoch} was committed. Point the sink back at "
            f"{marker.target}, or, if the epoch must be written again into {scope.target}, "
            f"delete that one marker first: DELETE FROM {state.display(MARKERS_TABLE)} WHERE "
            f"pipeline = {_literal(scope.pipeline)} AND sink = {_literal(scope.sink)} AND "
            f"epoch = {marker.epoch};"
        )
    else:
        advice = (
            "Another state wrote it (a smoke run under the same pipeline and sink names, or "
            "a state folder that was wiped or replaced). If this pipeline's state was "
            f"replaced, resume with the original state ({describe_log(marker.log_id)}). If "
            "that earlier run's rows are to be written again from this state, delete its "
            f"markers and fence first: {_delete_sql(state, scope, marker.log_id)}"
        )
    return MarkerMismatchError(
        head + advice,
        pipeline=scope.pipeline,
        sink=scope.sink,
        epoch=marker.epoch,
        found_target=marker.target,
        found_log_id=marker.log_id,
        found_generation=marker.generation,
        committed_at=str(marker.committed_at),
        target=scope.target,
        log_id=scope.log_id,
    )


def check_fence(
    fence: Fence, scope: Scope, state: StateTables, newest: Marker | None = None
) -> MarkerMismatchError | None:
    """None if the fence row of (pipeline, sink) belongs to this writer's progress log.

    The fence row is claimed by the first progress log that writes through the
    sink; a newer generation of the same log takes it over, another log never
    does. This catches a wiped or replaced state even for epochs whose markers
    were pruned. ``newest``, the newest marker of (pipeline, sink) if known,
    makes the message say which table and epochs the other state wrote.
    """
    if fence.log_id == scope.log_id:
        return None
    wrote = ""
    if newest is not None and newest.log_id == fence.log_id:
        wrote = (
            f"; it committed epochs up to {newest.epoch} into table {newest.target} (last at "
            f"{newest.committed_at}, generation {newest.generation})"
        )
    return MarkerMismatchError(
        f"postgres sink {scope.sink!r} of pipeline {scope.pipeline!r} (table {scope.target}): "
        f"its fence row in {state.display(FENCES_TABLE)} belongs to "
        f"{describe_log(fence.log_id)} (generation {fence.generation}, updated at "
        f"{fence.updated_at}){wrote}, not to this pipeline's {describe_log(scope.log_id)}. "
        "Another state has written this sink's epochs (a smoke run under the same names, or a "
        "state folder that was wiped or replaced), so its markers would pass for this "
        "pipeline's. Nothing was written. If this pipeline's state was replaced, resume with "
        f"the original state ({describe_log(fence.log_id)}). If that run's rows are to be "
        "written again from this state, delete its markers and fence first: "
        f"{_delete_sql(state, scope, fence.log_id)}",
        pipeline=scope.pipeline,
        sink=scope.sink,
        found_log_id=fence.log_id,
        found_generation=fence.generation,
        found_target=None if newest is None else newest.target,
        log_id=scope.log_id,
    )
