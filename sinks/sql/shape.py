"""The target table on MySQL and MariaDB as the writes rely on it: checked at bind, read per epoch.

Read from ``information_schema`` in one query (:func:`read_shape`): the
table's engine, its columns (type and collation), its unique indexes.

At bind (:func:`bind_problems`), the sink refuses a target whose

- engine is not transactional (MyISAM, Aria, ...): an epoch that rolls back
  would leave its rows written;
- key columns can hold two distinct keys that the table takes for one: a
  ``CHAR`` or ``BINARY`` column (padded: ``'x'`` and ``'x '`` are one value),
  or a text column whose collation is not binary and NO PAD. MariaDB's
  default, ``utf8mb4_general_ci``, takes ``'A'`` and ``'a'`` for one key;
  ``utf8mb4_bin`` is PAD SPACE and takes ``'x'`` and ``'x '`` for one; both would
  commit two of the engine's keys into one row, and a repair would then
  "repair" them for ever. ``utf8mb4_nopad_bin`` (MariaDB), ``utf8mb4_0900_bin``
  (MySQL 8) and ``VARBINARY`` tell every two strings apart. The engine cannot
  make such a key exact instead: the table's own primary key (and ON
  DUPLICATE KEY) compare in the column's collation.

In every epoch's transaction (:func:`lock_target`, then :func:`read_shape`),
first a statement on the table takes its metadata lock, which an ``ALTER``
of it waits for until the transaction ends; then the shape is read again:

- a column dropped, or given another type or collation, since the sink bound
  refuses the epoch, naming it (:func:`changes`): the write path never writes
  through a stale picture of the table what verify would then refuse for ever;
- the unique indexes decide whether the upserts may go in place (``rows.py``):
  one added while the pipeline runs is seen by the next epoch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import sqlalchemy as sa

from reconcile.core.contract import InvalidInputError

__all__ = [
    "Column",
    "TargetShape",
    "bind_problems",
    "changes",
    "epoch_shape",
    "lock_target",
    "read_shape",
]

# Collations that tell every two distinct strings apart: binary, and NO PAD.
_EXACT = frozenset({"binary", "utf8mb4_0900_bin"})
_PADDED_TYPES = {"char": "VARCHAR", "binary": "VARBINARY"}


@dataclass(frozen=True)
class Column:
    """A column as ``information_schema.COLUMNS`` gives it."""

    data_type: str  # DATA_TYPE: 'varchar'
    column_type: str  # COLUMN_TYPE: 'varchar(64)'
    collation: str | None

    def __str__(self) -> str:
        return self.column_type + (f" COLLATE {self.collation}" if self.collation else "")


@dataclass(frozen=True)
class TargetShape:
    """The table's engine (and whether it is transactional), columns and unique indexes."""

    engine: str | None
    transactional: bool
    columns: dict[str, Column] = field(default_factory=dict)
    # index name -> its columns, each with its prefix length (None: the whole column)
    unique: dict[str, tuple[tuple[str, int | None], ...]] = field(default_factory=dict)


def lock_target(conn: sa.Connection, schema: str | None, name: str) -> None:
    """Take the table's metadata lock for the rest of the transaction (no row is read)."""
    conn.execute(sa.select(sa.literal(1)).select_from(sa.table(name, schema=schema)).limit(0))


def read_shape(conn: sa.Connection, schema: str | None, name: str) -> TargetShape:
    """The table's shape now (call :func:`lock_target` first, in the same transaction)."""
    where = "TABLE_SCHEMA = COALESCE(%(schema)s, DATABASE()) AND TABLE_NAME = %(name)s"
    rows = conn.exec_driver_sql(
        "SELECT 'e', t.ENGINE, e.TRANSACTIONS, NULL, NULL, NULL FROM information_schema.TABLES t "
        f"LEFT JOIN information_schema.ENGINES e ON e.ENGINE = t.ENGINE WHERE t.{where} "
        "UNION ALL SELECT 'c', COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, COLLATION_NAME, "
        f"ORDINAL_POSITION FROM information_schema.COLUMNS WHERE {where} "
        "UNION ALL SELECT 'u', INDEX_NAME, COLUMN_NAME, SUB_PART, NULL, SEQ_IN_INDEX "
        f"FROM information_schema.STATISTICS WHERE {where} AND NON_UNIQUE = 0",
        {"schema": schema, "name": name},
    ).fetchall()
    engine, transactional = None, False
    columns: dict[str, Column] = {}
    unique: dict[str, list[tuple[int, str, int | None]]] = {}
    for kind, a, b, c, d, position in rows:
        if kind == "e":
            engine, transactional = (None if a is None else str(a)), b == "YES"
        elif kind == "c":
            columns[str(a)] = Column(str(b).lower(), str(c), None if d is None else str(d))
        else:
            part = None if c is None else int(c)
            unique.setdefault(str(a), []).append((int(position), str(b), part))
    return TargetShape(
        engine,
        transactional,
        columns,
        {ix: tuple((col, part) for _, col, part in sorted(cols)) for ix, cols in unique.items()},
    )


def _exact(collation: str) -> bool:
    return collation in _EXACT or (collation.endswith("_bin") and "_nopad_" in collation)


def bind_problems(shape: TargetShape, keys: list[str]) -> list[str]:
    """What makes the table unusable as the sink's target, as sentences (empty: nothing)."""
    problems = []
    if not shape.transactional:
        problems.append(
            f"it is {shape.engine or 'not a table'}, which does not roll back: an epoch that "
            "fails half-way would leave its rows written; use ENGINE=InnoDB"
        )
    for key in keys:
        column = shape.columns.get(key)
        if column is None:
            continue  # named by the key check
        if column.data_type in _PADDED_TYPES:
            problems.append(
                f"key column {key} is {column.column_type}, which pads its values "
                f"('x' and 'x ' are one key); use {_PADDED_TYPES[column.data_type]}"
            )
        elif column.collation is not None and not _exact(column.collation):
            problems.append(
                f"key column {key} has collation {column.collation}, which takes "
                "distinct keys for one (case, accents or trailing spaces); use "
                "utf8mb4_nopad_bin (MariaDB), utf8mb4_0900_bin (MySQL 8) or VARBINARY"
            )
    return problems


def changes(bound: TargetShape, now: TargetShape, table: str) -> list[str]:
    """How the table changed since bind in what the write path relies on, as sentences."""
    found = []
    if now.transactional != bound.transactional or now.engine != bound.engine:
        found.append(f"table {table} is now {now.engine or 'gone'}, was {bound.engine}")
    for name, column in bound.columns.items():
        after = now.columns.get(name)
        if after is None:
            found.append(f"column {name} ({column}) of table {table} was dropped")
        elif after != column:
            found.append(f"column {name} of table {table} changed from {column} to {after}")
    return found


def epoch_shape(
    conn: sa.Connection, bound: TargetShape, schema: str | None, name: str
) -> TargetShape:
    """The table's shape in this transaction, which holds its metadata lock from here on.

    Raises:
        InvalidInputError: a column dropped or retyped, or the engine changed,
            since ``bound`` was read; naming the table, the column and both types.
    """
    lock_target(conn, schema, name)
    now = read_shape(conn, schema, name)
    table = f"{schema}.{name}" if schema else name
    found = changes(bound, now, table)
    if found:
        raise InvalidInputError(
            f"{'; '.join(found)}, since the sink bound to it: someone changed the table under "
            "the running sink. The expected state still holds it as it was, so nothing is "
            "written through the change; change it back, or stop the pipeline and make the "
            "change through it",
            table=table,
        )
    return now
