"""Writing an epoch's rows through SQLAlchemy: deletes, then the upserted rows.

The one upsert every database has is "delete the key, insert the row", one
statement per key for the deletes. On MySQL and MariaDB, where a round trip per
key bounds a big epoch (about 9k rows/s over PyMySQL), the upserts are instead
``INSERT ... ON DUPLICATE KEY UPDATE`` in multi-row statements, and the deletes
``DELETE ... WHERE (key) IN (...)`` in chunks, where that is the same write:
see :func:`upserts_in_place`, which decides by the unique indexes read in the
epoch's own transaction (``shape.py``), never by a picture of the table from
bind: an index added since would turn an upsert into an overwrite.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import mysql

from reconcile.core.contract import Change

from .shape import TargetShape, lock_target, read_shape

__all__ = ["EPOCH_COLUMN", "upserts_in_place", "write_rows"]

EPOCH_COLUMN = "_epoch"
# Keys per DELETE ... IN (...) statement: far under MySQL's max_allowed_packet
# for any key, and few enough round trips for a million deleted keys.
_DELETE_CHUNK = 1000
_IN_PLACE_DIALECTS = frozenset({"mysql", "mariadb"})


def upserts_in_place(conn: sa.Connection, shape: TargetShape | None, keys: list[str]) -> bool:
    """Whether ``INSERT ... ON DUPLICATE KEY UPDATE`` writes exactly what delete + insert would.

    It does when:
      * the dialect has it (MySQL, MariaDB), and ``shape`` was read in the
        transaction that writes (see ``shape.py``);
      * the table's only unique index is its primary key, and that is the key,
        whole columns each: ON DUPLICATE KEY fires on *any* unique index, so a
        row whose other unique column clashes with another key's row would
        update that row in place, where delete + insert fails on the
        constraint; a primary key wider than the key never fires for a key
        whose other columns changed (the key's row would repeat); a prefix
        index takes two keys that share the prefix for one.

    A column a row leaves out needs no condition: the update sets every
    non-key column to ``VALUES(column)``, the value the insert would have
    written, which for a column left out is its default, as delete + insert
    gives it.
    """
    if conn.dialect.name not in _IN_PLACE_DIALECTS or shape is None:
        return False
    primary = shape.unique.get("PRIMARY", ())
    if set(shape.unique) != {"PRIMARY"} or any(part is not None for _, part in primary):
        return False
    return sorted(column for column, _ in primary) == sorted(keys)


def write_rows(
    conn: sa.Connection,
    table: sa.Table,
    keys: list[str],
    items: Sequence[Any],
    epoch: int,
    shape: TargetShape | None = None,
) -> int:
    """Apply upserts and deletes: the deleted keys removed, the upserted rows written.

    ``shape``: the table as read in this transaction, after its metadata
    lock; on MySQL and MariaDB it is read here when not given.

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
    rows = list(upserts.values())
    if EPOCH_COLUMN in table.c:
        for row in rows:
            row[EPOCH_COLUMN] = epoch
    if shape is None and conn.dialect.name in _IN_PLACE_DIALECTS:
        lock_target(conn, table.schema, table.name)
        shape = read_shape(conn, table.schema, table.name)
    if upserts_in_place(conn, shape, keys):
        _delete_in_chunks(conn, table, keys, list(deletes))
        _insert_or_update(conn, table, keys, rows)
        return len(upserts) + len(deletes)
    match = sa.and_(*(table.c[k] == sa.bindparam(f"k_{k}") for k in keys))
    gone = list(deletes.values()) + [{f"k_{k}": r[k] for k in keys} for r in rows]
    if gone:
        conn.execute(table.delete().where(match), gone)
    if rows:
        conn.execute(table.insert(), rows)
    return len(upserts) + len(deletes)


def _delete_in_chunks(
    conn: sa.Connection, table: sa.Table, keys: list[str], gone: list[tuple[Any, ...]]
) -> None:
    """``DELETE ... WHERE (k1, k2) IN ((...), ...)``, ``_DELETE_CHUNK`` keys a statement."""
    columns = sa.tuple_(*(table.c[k] for k in keys))
    for start in range(0, len(gone), _DELETE_CHUNK):
        conn.execute(table.delete().where(columns.in_(gone[start : start + _DELETE_CHUNK])))


def _insert_or_update(
    conn: sa.Connection, table: sa.Table, keys: list[str], rows: list[dict[str, Any]]
) -> None:
    """The rows inserted, or their key's row updated to them, in multi-row statements.

    SQLAlchemy sends an executemany INSERT as multi-row VALUES pages
    ("insertmanyvalues"), ON DUPLICATE KEY UPDATE clause included.
    """
    if not rows:
        return
    statement = mysql.insert(table)
    # A table of key columns only: the row already there is the row, so its key
    # is "updated" to itself (INSERT IGNORE would also turn errors into warnings).
    others = [c.name for c in table.columns if c.name not in keys] or keys[:1]
    statement = statement.on_duplicate_key_update(
        {name: statement.inserted[name] for name in others}
    )
    conn.execute(statement, rows)
