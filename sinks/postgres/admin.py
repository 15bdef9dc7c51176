"""What the ``reconcile`` command line does with a Postgres sink database: show, settle, prune.

``database_status`` only reads (its session is read-only); ``prepared`` and
``prune`` change the database only when asked to (``apply=True``).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from reconcile.core.contract import ConfigurationError
from reconcile.core.progress import EpochStatus, ProgressState

from .connection import PgTarget, connect_failure
from .health import find_state_schemas, list_prepared, prune_markers, settle_prepared
from .markers import FENCES_TABLE, StateTables

__all__ = ["committed_attempts", "database_status", "prepared", "prune"]


@contextlib.contextmanager
def _connect(dsn: str, *, read_only: bool) -> Iterator[psycopg.Connection[Any]]:
    target = PgTarget.parse(dsn)
    options = target.params.get("options", "")
    if read_only:
        # Every transaction of this session is read-only: status cannot write.
        options = f"{options} -c default_transaction_read_only=on".strip()
    try:
        conn = target.connect(autocommit=True, application_name="reconcile-cli", options=options)
    except psycopg.OperationalError as err:
        raise connect_failure(target, err, "reconcile") from None
    with conn:
        yield conn


def _iso(value: Any) -> str | None:
    return None if value is None else str(value)


def database_status(
    dsn: str, pipeline: str, progress: ProgressState, *, older_than_s: float
) -> dict[str, Any]:
    """The pipeline's markers, fences and prepared txns in the database (read-only).

    Every schema holding a reconcile_commits table is shown; each group of
    markers and each fence row says whether it belongs to ``progress``'s log.
    """
    with _connect(dsn, read_only=True) as conn:
        found: dict[str, Any] = {"database": PgTarget.parse(dsn).describe(), "schemas": []}
        for schema in find_state_schemas(conn):
            state = StateTables(schema)
            markers = [
                {
                    "sink": r[0],
                    "log_id": r[1],
                    "this_log": r[1] == progress.log_id,
                    "target": f"{r[2]}.{r[3]}",
                    "markers": int(r[4]),
                    "epochs": [int(r[5]), int(r[6])],
                    "last_committed_at": _iso(r[7]),
                    "generation": int(r[8]),
                }
                for r in conn.execute(
                    sql.SQL(
                        "SELECT sink, log_id, target_schema, target_table, count(*), min(epoch), "
                        "max(epoch), max(committed_at), max(generation) FROM {} "
                        "WHERE pipeline = %s GROUP BY 1, 2, 3, 4 ORDER BY 1, 6"
                    ).format(state.markers),
                    (pipeline,),
                )
            ]
            fences = []
            has_fences = conn.execute(
                "SELECT to_regclass(%s) IS NOT NULL", (state.display(FENCES_TABLE),)
            ).fetchone()
            if has_fences == (True,):
                fences = [
                    {
                        "sink": r[0],
                        "generation": int(r[1]),
                        "log_id": r[2],
                        "this_log": r[2] == progress.log_id,
                        "updated_at": _iso(r[3]),
                    }
                    for r in conn.execute(
                        sql.SQL(
                            "SELECT sink, generation, log_id, updated_at FROM {} "
                            "WHERE pipeline = %s ORDER BY 1"
                        ).format(state.fences),
                        (pipeline,),
                    )
                ]
            found["schemas"].append({"schema": schema, "markers": markers, "fences": fences})
        found["prepared"] = [
            {
                "gid": str(p.txn_id),
                "age_s": round(p.age_s, 1),
                "owner": p.owner,
                "older_than_threshold": p.age_s > older_than_s,
                "epoch_status": _status_of(progress, p.txn_id.epoch),
            }
            for p in list_prepared(conn, pipeline)
        ]
        return found


def _status_of(progress: ProgressState, epoch: int) -> str:
    status = progress.status_of(epoch)
    return "unrecorded" if status is None else status.value


def committed_attempts(state_dir: Path, pipeline: str) -> set[tuple[int, int]]:
    """(epoch, generation) of every "committed" entry of a file progress log (read-only).

    The progress state keeps only each epoch's latest status; which generation
    passed the commit point is in the entries themselves. A torn last line
    is ignored, as ``read_progress`` ignores it.
    """
    data = (Path(state_dir) / f"{pipeline}.progress.jsonl").read_bytes()
    found = set()
    for line in data[: data.rfind(b"\n") + 1].splitlines():
        entry = json.loads(line)
        if entry.get("t") == "epoch" and entry.get("status") == EpochStatus.COMMITTED.value:
            found.add((int(entry["epoch"]), int(entry["gen"])))
    return found


def prepared(
    dsn: str, pipeline: str, progress: ProgressState, state_dir: Path, *, apply: bool
) -> list[dict[str, str]]:
    """The pipeline's prepared txns and what ``settle_prepared`` does with each (see health.py)."""
    committed = committed_attempts(state_dir, pipeline)
    with _connect(dsn, read_only=not apply) as conn:
        return [
            {"gid": str(s.txn_id), "action": s.action, "reason": s.reason}
            for s in settle_prepared(conn, progress, pipeline, committed=committed, apply=apply)
        ]


def prune(
    dsn: str,
    pipeline: str,
    progress: ProgressState,
    *,
    keep_epochs: int,
    state_schema: str | None,
    apply: bool,
) -> dict[str, Any]:
    """Apply (or, without ``apply``, count) the marker retention rule of health.prune_markers.

    Raises:
        ConfigurationError: no marker table, or several and no ``state_schema``.
    """
    with _connect(dsn, read_only=not apply) as conn:
        schemas = [state_schema] if state_schema else find_state_schemas(conn)
        if len(schemas) != 1:
            raise ConfigurationError(
                f"reconcile pg prune: {'no' if not schemas else 'several'} reconcile_commits "
                f"tables found ({schemas}); name one with --state-schema"
            )
        below, count = prune_markers(
            conn,
            StateTables(schemas[0]),
            progress,
            pipeline,
            keep_epochs=keep_epochs,
            apply=apply,
        )
        return {
            "schema": schemas[0],
            "log_id": progress.log_id,
            "below_epoch": below,
            "deleted" if apply else "would_delete": count,
        }
