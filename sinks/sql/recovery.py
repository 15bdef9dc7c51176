"""Pull-and-diff on any SQLAlchemy database: reflection, keyset pagination, one repair transaction.

The generic path of ``reconcile.recover``. The table is reflected; rows are
read in key order one page at a time (``WHERE (k1, k2) > (:last) ORDER BY k1, k2
LIMIT n``: every page is an index range scan, whatever the table's size), in
one transaction (REPEATABLE READ where the database has it; SQLite's reads are
serializable) that also reads the newest marker. Scoped mode stages the keys in
a temporary table. Buckets mode is PostgreSQL's (checksums computed by the
server); here it says so. The repair is one transaction with its markers.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
import sqlalchemy as sa

from reconcile.core.conform import SinkColumn, values_to_arrow
from reconcile.core.contract import (
    Change,
    FencedError,
    InvalidInputError,
    MarkerMismatchError,
    RetryableError,
)
from reconcile.core.target import KeyRange, Progress, Repair, RepairTurn
from sinks.objects.sql_state import create_scope_keys

from .arrow_types import MARIADB_DIALECTS, is_boolean
from .repair_turn import sql_repair_turn
from .rows import EPOCH_COLUMN, write_rows
from .sessions import mark_session
from .sink import SqlSink

__all__ = ["SqlRecoveryTarget", "sink_kind"]

PAGE_ROWS = 50_000


def sink_kind(column: sa.Column[Any], dialect: str) -> str:
    """The recovery kind of a reflected column, by its SQLAlchemy type."""
    t = column.type
    if is_boolean(t, dialect):
        return "bool"
    if isinstance(t, sa.Integer):
        return "int"
    if isinstance(t, sa.Float):
        # REAL is 4 bytes in PostgreSQL, 8 in SQLite (its only float) and in MariaDB,
        # whose FLOAT is the 4-byte one.
        if dialect in MARIADB_DIALECTS:
            return "float4" if type(t).__name__ == "FLOAT" else "float8"
        return "float4" if isinstance(t, sa.REAL) and dialect != "sqlite" else "float8"
    if isinstance(t, sa.Numeric):
        return "numeric"
    if isinstance(t, sa.Uuid):
        return "uuid"
    if isinstance(t, sa.String):
        return "text"
    if isinstance(t, sa.DateTime):
        return "timestamptz" if t.timezone else "timestamp"
    if isinstance(t, sa.Date):
        return "date"
    if isinstance(t, sa.LargeBinary):
        return "bytes"
    name = type(t).__name__.upper()
    if name in ("REAL", "DOUBLE", "DOUBLE_PRECISION"):
        return "float8"
    if name in ("BLOB", "BYTEA", "BINARY", "VARBINARY", "TINYBLOB", "MEDIUMBLOB", "LONGBLOB"):
        return "bytes"
    return "other"


def _to_arrow(rows: list[tuple[Any, ...]], schema: pa.Schema) -> pa.Table:
    """Python values in the expected state's types; values that do not fit are flagged."""
    columns = []
    for i, field in enumerate(schema):
        values = [r[i] for r in rows]
        if pa.types.is_string(field.type) or pa.types.is_large_string(field.type):
            values = [str(v) if isinstance(v, uuid.UUID) else v for v in values]
        elif pa.types.is_boolean(field.type):
            # MariaDB's BOOLEAN (TINYINT(1)) gives 0 and 1; any other number it may
            # hold is no boolean, and stays an int to be flagged unconvertible.
            values = [bool(v) if type(v) is int and v in (0, 1) else v for v in values]
        columns.append(values)
    return values_to_arrow(columns, schema)


class _Snapshot:
    """One transaction on the sink table (the protocol ``SinkSnapshot``)."""

    def __init__(self, target: SqlRecoveryTarget, conn: sa.Connection, schema: pa.Schema,
                 keys: list[str]) -> None:  # fmt: skip
        self.target, self.conn, self.schema, self.keys = target, conn, schema, keys
        self.table = target.sink.target()
        state = target.sink.state
        self.newest_epoch = (
            state.newest(conn, target.pipeline, target.sink.name) if state.exists(conn) else None
        )
        self.warnings: list[str] = []
        # No bucket checksums on this path: nothing reads key ranges.
        self.narrow_ranges = False

    def _select(self) -> sa.Select[Any]:
        return sa.select(*(self._column(field) for field in self.schema))

    def _column(self, field: pa.Field) -> sa.ColumnElement[Any]:
        column: sa.Column[Any] = self.table.c[str(field.name)]
        if pa.types.is_float32(field.type) and self.conn.dialect.name in MARIADB_DIALECTS:
            # MariaDB sends a FLOAT as text rounded to 6 digits, which is not the float
            # it holds; as a double (exact from a float) it is.
            widened: sa.ColumnElement[float] = sa.type_coerce(
                column + sa.literal_column("0e0"), sa.Double(asdecimal=False)
            )
            return widened.label(str(field.name))
        if pa.types.is_floating(field.type) and getattr(column.type, "asdecimal", False):
            # MariaDB's DOUBLE and FLOAT reflect as types that hand back a Decimal
            # rounded to ten digits: read as the server's own binary float instead.
            coerced: sa.ColumnElement[Any] = sa.type_coerce(column, sa.Double(asdecimal=False))
            return coerced.label(str(field.name))
        return column

    def _rows(self, statement: sa.Select[Any]) -> pa.Table:
        return _to_arrow([tuple(r) for r in self.conn.execute(statement)], self.schema)

    def pull_all(self, progress: Progress | None) -> pa.Table:
        """Every row, page by page in key order (keyset pagination)."""
        parts: list[pa.Table] = []
        self.pull_each(parts.append, progress)
        if not parts:
            return _to_arrow([], self.schema)
        return pa.concat_tables(parts)

    def pull_each(self, each: Callable[[pa.Table], None], progress: Progress | None) -> None:
        """Every row, handed to ``each`` a page at a time (keyset pagination: bounded memory)."""
        key_cols = [self.table.c[k] for k in self.keys]
        positions = [self.schema.names.index(k) for k in self.keys]
        last: tuple[Any, ...] | None = None
        pulled = 0
        while True:
            statement = self._select().order_by(*key_cols).limit(PAGE_ROWS)
            if last is not None:
                statement = statement.where(sa.tuple_(*key_cols) > sa.tuple_(*last))
            rows = [tuple(r) for r in self.conn.execute(statement)]
            if not rows:
                break
            each(_to_arrow(rows, self.schema))
            pulled += len(rows)
            if progress is not None:
                progress(pulled, None)
            last = tuple(rows[-1][p] for p in positions)
            if len(rows) < PAGE_ROWS:
                break

    def estimated_rows(self) -> int | None:
        """None: this path has no cheap estimate (a count would read the table once more)."""
        return None

    def pull_keys(self, keys: pa.Table, newer_than: int) -> pa.Table:
        """Rows of the staged keys (a temporary table), plus rows of later epochs."""
        if EPOCH_COLUMN not in self.table.c:
            raise InvalidInputError(
                f"table {self.target.display} has no {EPOCH_COLUMN} column, which scoped mode "
                "needs; use mode full",
                table=self.target.display,
            )
        staged = create_scope_keys(
            self.conn, [sa.Column(k, self.table.c[k].type) for k in self.keys]
        )
        if keys.num_rows:
            self.conn.execute(staged.insert(), keys.select(self.keys).to_pylist())
        join = sa.and_(*(self.table.c[k] == staged.c[k] for k in self.keys))
        by_key = self._select().select_from(self.table.join(staged, join))
        later = self._select().where(self.table.c[EPOCH_COLUMN] > newer_than)
        rows = [tuple(r) for r in self.conn.execute(sa.union(by_key, later))]
        return _to_arrow(rows, self.schema)

    def count_rows(self) -> int:
        """The rows the table holds in this transaction (for the mass-change brake)."""
        return int(
            self.conn.execute(sa.select(sa.func.count()).select_from(self.table)).scalar_one()
        )

    def check_buckets(self) -> None:
        raise InvalidInputError(
            f"table {self.target.display}: buckets mode needs the database to checksum rows, "
            "which the generic SQL path does not do (it runs on PostgreSQL's fast path); use "
            "mode full or scoped"
        )

    def bucket_sums(
        self, bounds: list[Any], within: Sequence[KeyRange]
    ) -> dict[int, tuple[int, int]]:
        self.check_buckets()
        return {}

    def pull_ranges(self, ranges: Sequence[KeyRange]) -> pa.Table:
        self.check_buckets()
        return _to_arrow([], self.schema)


class SqlRecoveryTarget:
    """The ``RecoveryTarget`` of one table through SQLAlchemy (see ``SqlSink``)."""

    bucket_checksums = False

    def __init__(
        self, sink: SqlSink, pipeline: str, generation: int | None, *, write: bool
    ) -> None:
        self.sink, self.pipeline, self.generation, self.write = sink, pipeline, generation, write

    @property
    def display(self) -> str:
        return (
            f"{self.sink.schema_name + '.' if self.sink.schema_name else ''}{self.sink.table_name}"
        )

    @property
    def epoch_column(self) -> bool:
        return EPOCH_COLUMN in self.sink.target().c

    def columns(self) -> dict[str, SinkColumn]:
        table = self.sink.target()
        dialect = self.sink.engine.dialect.name
        return {
            c.name: SinkColumn(c.name, sink_kind(c, dialect), str(c.type)) for c in table.columns
        }

    def key_columns(self) -> list[str]:
        return self.sink.key_columns()

    @contextmanager
    def snapshot(self, schema: pa.Schema, keys: list[str]) -> Iterator[_Snapshot]:
        self.sink.target()
        with self.sink.engine.connect() as conn:
            if conn.dialect.name in ("postgresql", "mysql", "mariadb"):
                conn = conn.execution_options(isolation_level="REPEATABLE READ")
            with conn.begin() as txn:
                try:
                    yield _Snapshot(self, conn, schema, keys)
                finally:
                    txn.rollback()

    def take_repair_turn(self) -> AbstractContextManager[RepairTurn]:
        """Hold the table for one repair at a time (``repair_turn.py``), 15 minutes at most."""
        return sql_repair_turn(self.sink.engine, self.sink.schema_name, self.sink.table_name,
                               wait_s=15 * 60.0)  # fmt: skip

    def apply(self, repair: Repair) -> int | None:
        """The repair in ONE transaction: fence locked, newest marker re-checked, rows, markers."""
        sink, state = self.sink, self.sink.state
        table = sink.target()
        keys = sink.key_columns()
        repair_id = str(uuid.uuid4())
        try:
            with sink.engine.begin() as conn:
                # Marked as the writer's epochs are: a takeover ends it too (sessions.py).
                mark_session(conn, self.pipeline, sink.name, sink._log_id())
                fence = state.lock_fence(conn, self.pipeline, sink.name, self.generation)
                newest = state.newest(conn, self.pipeline, sink.name)
                if newest != repair.seen_newest:
                    conn.rollback()
                    return None
                if newest is not None and repair.target_epoch < newest:
                    raise InvalidInputError(
                        f"sql sink {sink.name!r}: cannot repair to epoch {repair.target_epoch}, "
                        f"older than the sink's newest marker ({newest}); nothing was written"
                    )
                owner = self._owner(fence)
                items: list[Any] = [Change("delete", r) for r in repair.deletes.to_pylist()]
                items += repair.upserts.to_pylist()
                shape = sink.shape_now(conn)  # a column changed since bind refuses the repair
                applied = (
                    write_rows(conn, table, keys, items, repair.target_epoch, shape) if items else 0
                )
                markers = self._markers(conn, newest, repair, owner, applied)
                if not applied and not markers:
                    conn.rollback()
                    return 0
                conn.execute(state.repairs.insert().values(
                    repair_id=repair_id, pipeline=self.pipeline, sink=sink.name,
                    epoch=repair.target_epoch, target_table=sink.table_name, mode=repair.mode,
                    missing=repair.counts.get("missing", 0), extra=repair.counts.get("extra", 0),
                    changed=repair.counts.get("changed", 0), applied=applied,
                ))  # fmt: skip
        except (InvalidInputError, FencedError, MarkerMismatchError):
            raise
        except sa.exc.SQLAlchemyError as err:
            # Marker-only resolution: the repair's own row commits with it.
            with sink.engine.connect() as conn:
                found = conn.execute(
                    sa.select(state.repairs.c.repair_id).where(
                        state.repairs.c.repair_id == repair_id
                    )
                ).first()
            if found is not None:
                return applied
            raise RetryableError(sink._error("repair failed; nothing was written", err)) from None
        return applied

    def _owner(self, fence: tuple[int, str | None] | None) -> tuple[str | None, int] | None:
        log_id = self.sink._log_id()
        if self.generation is None:
            return fence and (fence[1], fence[0])  # an operator's repair: the fence's owner
        if fence is None or fence[1] != log_id:
            raise MarkerMismatchError(
                f"sql sink {self.sink.name!r}: the fence row belongs to another progress log "
                f"({None if fence is None else fence[1]!r}); nothing was written"
            )
        if fence[0] != self.generation:
            raise FencedError(
                f"sql sink {self.sink.name!r}: generation {self.generation} is fenced off by "
                f"{fence[0]}; nothing was written",
                generation=self.generation,
                fence=fence[0],
            )
        return log_id, self.generation

    def _markers(self, conn: sa.Connection, newest: int | None, repair: Repair,
                 owner: tuple[str | None, int] | None, applied: int) -> int:  # fmt: skip
        """The markers of every epoch after the newest one, up to the target (see repair.py)."""
        target = repair.target_epoch
        if owner is None or (newest is not None and newest >= target):
            return 0
        first = target if newest is None else newest + 1
        conn.execute(self.sink.state.markers.insert(), [
            {"pipeline": self.pipeline, "sink": self.sink.name, "epoch": e,
             "target_table": self.sink.table_name, "log_id": owner[0], "generation": owner[1],
             "row_count": applied if e == target else 0}
            for e in range(first, target + 1)
        ])  # fmt: skip
        return target - first + 1

    def close(self) -> None:
        self.sink.close()
