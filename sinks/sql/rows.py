"""Writing an epoch's rows through SQLAlchemy: each key deleted, then the upserted rows inserted."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from reconcile.core.contract import Change

__all__ = ["EPOCH_COLUMN", "write_rows"]

EPOCH_COLUMN = "_epoch"


def write_rows(
    conn: sa.Connection, table: sa.Table, keys: list[str], items: Sequence[Any], epoch: int
) -> int:
    """Apply upserts and deletes: each key deleted, then the upserted rows inserted.

    Returns the rows upserted plus the keys deleted.
    """
    upserts: dict[tuple[Any, ...], dict[str, Any]] = {}
    deletes: dict[tuple[Any, ...], dict[str, Any]] = {}
    for item in items:
        row, op = (item.row, item.op) if isinstance(item, Change) else (item, "upsert")
        key = tuple(row[k] for k in keys)
        if op == "delete":
            upserts.pop(key, None)
            deletes[key] = {f"k_{k}": row[k] for k in keys}
        else:
            deletes.pop(key, None)
            upserts[key] = dict(row)
    match = sa.and_(*(table.c[k] == sa.bindparam(f"k_{k}") for k in keys))
    gone = list(deletes.values()) + [{f"k_{k}": r[k] for k in keys} for r in upserts.values()]
    if gone:
        conn.execute(table.delete().where(match), gone)
    if upserts:
        rows = list(upserts.values())
        if EPOCH_COLUMN in table.c:
            for row in rows:
                row[EPOCH_COLUMN] = epoch
        conn.execute(table.insert(), rows)
    return len(upserts) + len(deletes)
