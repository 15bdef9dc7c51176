"""What a failover run observes: who leads (the event log), when markers committed (Postgres).

Kept apart from the harness that starts, kills and pauses the processes
(``reconcile.demo.tpch.failover``): these only read.
"""

from __future__ import annotations

from typing import Any

import psycopg

from reconcile.demo.tpch.events import EventLog
from reconcile.demo.tpch.pipeline import PIPELINE

__all__ = ["commits_of", "first_marker", "leading_now", "markers_after"]


def leading_now(
    events: EventLog, alive: set[int], above: int = 0
) -> tuple[int, int | None, int] | None:
    """(pid, generation, tenure) of the live process that leads now, in a tenure above ``above``.

    A process leads from its ``leading`` event until a ``stepped_down`` event of
    the same tenure.
    """
    down = {(e["pid"], e["tenure"]) for e in events.of("stepped_down")}
    found = None
    for e in events.of("leading"):
        if e["pid"] not in alive or (e["pid"], e["tenure"]) in down or e["tenure"] <= above:
            continue
        if found is None or e["tenure"] > found[2]:
            found = (e["pid"], e.get("generation"), e["tenure"])
    return found


def commits_of(events: EventLog, pid: int, tenure: int) -> int:
    return sum(1 for e in events.of("committed") if e["pid"] == pid and e.get("tenure") == tenure)


def _markers(
    dsn: str, select: str, condition: str, params: tuple[Any, ...]
) -> tuple[Any, ...] | None:
    """``SELECT select`` over the pipeline's markers where ``condition``; None if none exist."""
    from psycopg import sql

    from sinks.postgres.health import find_state_schemas
    from sinks.postgres.markers import MARKERS_TABLE

    with psycopg.connect(dsn, autocommit=True) as conn:
        schemas = find_state_schemas(conn)
        if not schemas:
            return None
        query = sql.SQL("SELECT {} FROM {} WHERE pipeline = %s AND {}").format(
            sql.SQL(select), sql.Identifier(schemas[0], MARKERS_TABLE), sql.SQL(condition)
        )
        return conn.execute(query, (PIPELINE, *params)).fetchone()


def first_marker(dsn: str, generation: int, after_epoch: int | None) -> float | None:
    """Commit time (epoch seconds) of the first marker of ``generation`` or later, past an epoch.

    Past ``after_epoch``, the newest epoch decided before the takeover: an epoch
    the takeover's recovery wrote into a sink (under the new generation) is
    the old leader's, finished; what is timed is the new leader's own first.
    """
    row = _markers(dsn, "extract(epoch FROM min(committed_at))", "generation >= %s AND epoch > %s",
                   (generation, -1 if after_epoch is None else after_epoch))  # fmt: skip
    return float(row[0]) if row and row[0] is not None else None


def markers_after(dsn: str, generation: int, after: float) -> int:
    """Markers of ``generation`` committed after ``after`` (epoch seconds)."""
    row = _markers(dsn, "count(*)", "generation = %s AND committed_at > to_timestamp(%s)",
                   (generation, after))  # fmt: skip
    return int(row[0]) if row else 0
