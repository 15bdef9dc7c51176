"""Staged epoch batches: normalizing rows, Changes and Arrow tables, and validating them."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
import pyarrow.compute as pc  # type: ignore[import-untyped, unused-ignore]
from psycopg.types.json import Json, Jsonb

from reconcile.contract import Change, InvalidInputError

from .schema import EPOCH_COLUMN, Column, TableSchema

__all__ = ["EpochBatch", "ValidatedBatch", "validate_batch"]

_INT_RANGES = {"int2": 2**15, "int4": 2**31, "int8": 2**63}


@dataclass
class EpochBatch:
    """What has been staged for one epoch, in arrival order, not yet validated."""

    upserts: list[dict[str, Any]] = field(default_factory=list)
    deletes: list[dict[str, Any]] = field(default_factory=list)
    tables: list[pa.Table] = field(default_factory=list)

    def add(self, rows: Iterable[Any], *, id_column: str | None) -> None:
        """Append rows: dicts (upserts), Changes, or Arrow tables / record batches.

        Args:
            rows: the rows, or a single Arrow table.
            id_column: for an append-only target, the change-id column that a
                Change's ``change_id`` fills in; None for a keyed target.

        Raises:
            InvalidInputError: for a value that is not a row; nothing is staged then.
        """
        if isinstance(rows, pa.Table | pa.RecordBatch):
            rows = [rows]
        upserts: list[dict[str, Any]] = []
        deletes: list[dict[str, Any]] = []
        tables: list[pa.Table] = []
        for index, item in enumerate(rows):
            if isinstance(item, pa.Table):
                tables.append(item)
            elif isinstance(item, pa.RecordBatch):
                tables.append(pa.Table.from_batches([item]))
            elif isinstance(item, Change):
                row = dict(item.row)
                if id_column is not None:
                    if item.op == "delete":
                        raise InvalidInputError(
                            f"staged item {index} is a delete, but the target is append-only "
                            f"(keyed by change id column {id_column!r}); nothing was staged"
                        )
                    if item.change_id is not None:
                        given = row.get(id_column)
                        if given is not None and str(given) != str(item.change_id):
                            raise InvalidInputError(
                                f"staged item {index}: row column {id_column!r} = {given!r} "
                                f"differs from change_id {item.change_id!r}; nothing was staged"
                            )
                        row[id_column] = item.change_id
                (deletes if item.op == "delete" else upserts).append(row)
            elif isinstance(item, dict):
                upserts.append(item)
            else:
                raise InvalidInputError(
                    f"staged item {index} is a {type(item).__name__} ({item!r:.80}); expected a "
                    "dict row, a Change or an Arrow table; nothing was staged"
                )
        self.upserts.extend(upserts)
        self.deletes.extend(deletes)
        self.tables.extend(tables)

    def __len__(self) -> int:
        arrow_rows: int = sum(t.num_rows for t in self.tables)
        return len(self.upserts) + len(self.deletes) + arrow_rows


@dataclass
class ValidatedBatch:
    """A batch checked against the target table, with values coerced for COPY."""

    columns: tuple[str, ...]  # upserted columns, in table order; excludes _epoch
    rows: list[tuple[Any, ...]]  # dict upserts, coerced, in ``columns`` order
    arrow: pa.Table | None  # Arrow upserts, columns in ``columns`` order
    delete_keys: list[tuple[Any, ...]]  # key values, in schema.key order

    @property
    def row_count(self) -> int:
        """Rows upserted plus keys deleted."""
        arrow_rows = self.arrow.num_rows if self.arrow is not None else 0
        return len(self.rows) + arrow_rows + len(self.delete_keys)


class _Bad(Exception):
    """A value does not fit a column; the message says why."""


def _coerce(col: Column, value: Any) -> Any:
    """Check a non-NULL Python value against a column and convert it for binary COPY."""
    kind = col.kind
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise _Bad(f"expected an integer for {col.sql_type}")
        bound = _INT_RANGES[col.typname]
        if not -bound <= value < bound:
            raise _Bad(f"out of range for {col.sql_type}")
        return value
    if kind in ("numeric", "float"):
        if isinstance(value, bool) or not isinstance(value, int | float | decimal.Decimal):
            raise _Bad(f"expected a number for {col.sql_type}")
        if kind == "float":
            return float(value)
        return value if isinstance(value, decimal.Decimal) else decimal.Decimal(str(value))
    if kind == "bool":
        if not isinstance(value, bool):
            raise _Bad("expected a bool")
        return value
    if kind == "text":
        if not isinstance(value, str):
            raise _Bad(f"expected a str for {col.sql_type}")
        if "\x00" in value:
            raise _Bad("text cannot contain NUL characters")
        if col.max_length is not None and len(value) > col.max_length:
            raise _Bad(f"longer than {col.sql_type} allows")
        return value
    if kind == "uuid":
        if isinstance(value, uuid.UUID):
            return value
        if isinstance(value, str):
            try:
                return uuid.UUID(value)
            except ValueError:
                raise _Bad("not a UUID") from None
        raise _Bad("expected a UUID or a UUID string")
    if kind == "date":
        if isinstance(value, dt.datetime) or not isinstance(value, dt.date):
            raise _Bad("expected a datetime.date")
        return value
    if kind in ("timestamp", "timestamptz"):
        if not isinstance(value, dt.datetime):
            raise _Bad("expected a datetime.datetime")
        aware = value.tzinfo is not None and value.utcoffset() is not None
        if kind == "timestamptz" and not aware:
            raise _Bad("naive datetime for timestamptz: give a timezone-aware datetime")
        if kind == "timestamp" and aware:
            raise _Bad("timezone-aware datetime for timestamp without time zone")
        return value
    if kind == "time":
        if not isinstance(value, dt.time):
            raise _Bad("expected a datetime.time")
        return value
    if kind == "json":
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            raise _Bad("not JSON-serializable") from None
        return Jsonb(value) if col.typname == "jsonb" else Json(value)
    if kind == "bytes":
        if not isinstance(value, bytes | bytearray | memoryview):
            raise _Bad("expected bytes")
        return bytes(value)
    if kind == "interval":
        if not isinstance(value, dt.timedelta):
            raise _Bad("expected a datetime.timedelta")
        return value
    if not isinstance(value, str):
        raise _Bad(f"type {col.sql_type} takes its text form: give a str")
    return value


def _arrow_fits(col: Column, typ: pa.DataType) -> bool:
    """True if an Arrow column of type ``typ`` can be COPied into ``col``."""
    kind = col.kind
    if pa.types.is_null(typ):
        return True
    if pa.types.is_dictionary(typ):
        typ = typ.value_type
    stringy = pa.types.is_string(typ) or pa.types.is_large_string(typ)
    checks = {
        "int": pa.types.is_integer(typ),
        "numeric": pa.types.is_integer(typ)
        or pa.types.is_floating(typ)
        or pa.types.is_decimal(typ),
        "float": pa.types.is_integer(typ) or pa.types.is_floating(typ),
        "bool": pa.types.is_boolean(typ),
        "date": pa.types.is_date(typ),
        "timestamp": pa.types.is_timestamp(typ) and typ.tz is None,
        "timestamptz": pa.types.is_timestamp(typ) and typ.tz is not None,
        "time": pa.types.is_time(typ),
    }
    return bool(checks.get(kind, stringy))


_NO_VALUE: Any = object()


class _Checker:
    """Builds the errors: each names the sink, the table, the column and the value."""

    def __init__(self, sink: str, schema: TableSchema, epoch: int) -> None:
        self.sink, self.schema, self.epoch = sink, schema, epoch

    def error(
        self, what: str, column: str | None = None, value: Any = _NO_VALUE
    ) -> InvalidInputError:
        where = f" column {column!r}" if column is not None else ""
        shown = f" value {value!r:.200}" if value is not _NO_VALUE else ""
        return InvalidInputError(
            f"postgres sink {self.sink!r}, table {self.schema.display}{where}{shown}: {what} "
            f"(epoch {self.epoch}); nothing was written",
            sink=self.sink,
            table=self.schema.display,
            column=column,
            value=None if value is _NO_VALUE else repr(value)[:200],
            epoch=self.epoch,
        )


def validate_batch(
    schema: TableSchema, batch: EpochBatch, *, sink: str, epoch: int
) -> ValidatedBatch:
    """Check a staged batch against the target table before anything is written.

    Raises:
        InvalidInputError: for an unknown column, a value of an incompatible
            type, a NULL in a key or NOT NULL column, a missing key column, or a
            key that occurs twice among the epoch's changes.
    """
    check = _Checker(sink, schema, epoch)
    cols = schema.columns
    given: set[str] | None = None
    for source in [set(r) for r in batch.upserts] + [set(t.column_names) for t in batch.tables]:
        if given is None:
            given = source
        elif source != given:
            odd = sorted(source ^ given)[0]
            raise check.error(
                "the upserts of one epoch must all give the same columns; this column "
                "is given by some and not by others",
                odd,
            )
    given = given or set()
    for name in sorted(given):
        if name == EPOCH_COLUMN:
            value = next((r[name] for r in batch.upserts if name in r), _NO_VALUE)
            raise check.error("the sink writes this column itself; do not give it", name, value)
        if name not in cols:
            value = next((r[name] for r in batch.upserts if name in r), _NO_VALUE)
            raise check.error("the table has no such column (missing column)", name, value)
    if given:
        for name in schema.key:
            if name not in given:
                raise check.error("key column missing from the upserted rows", name)
        for col in cols.values():
            missing = col.name not in given and col.name != EPOCH_COLUMN
            if col.not_null and not col.has_default and missing:
                raise check.error("NOT NULL column missing from the upserted rows", col.name)
    columns = tuple(c for c in cols if c in given)
    key_pos = [columns.index(k) for k in schema.key] if given else []

    rows: list[tuple[Any, ...]] = []
    seen: dict[Any, int] = {}
    for index, raw in enumerate(batch.upserts):
        out: list[Any] = []
        for name in columns:
            col, value = cols[name], raw[name]
            if value is None:
                if name in schema.key:
                    raise check.error(f"NULL in key column (row {index})", name, None)
                if col.not_null:
                    raise check.error(f"NULL in NOT NULL column (row {index})", name, None)
                out.append(None)
                continue
            try:
                out.append(_coerce(col, value))
            except _Bad as bad:
                raise check.error(f"incompatible type: {bad} (row {index})", name, value) from None
        key = _hashable(tuple(out[p] for p in key_pos))
        if key in seen:
            raise check.error(
                f"duplicate key among the epoch's upserts (rows {seen[key]} and {index})",
                ",".join(schema.key),
                _shown_key(key),
            )
        seen[key] = index
        rows.append(tuple(out))

    arrow = _validate_arrow(check, schema, batch.tables, columns, seen) if batch.tables else None

    delete_keys: list[tuple[Any, ...]] = []
    deleted: set[Any] = set()
    for index, raw in enumerate(batch.deletes):
        values = []
        for name in schema.key:
            value = raw.get(name)
            if value is None:
                raise check.error(f"NULL or missing key column in delete {index}", name, value)
            try:
                values.append(_coerce(cols[name], value))
            except _Bad as bad:
                what = f"incompatible type: {bad} (delete {index})"
                raise check.error(what, name, value) from None
        key = _hashable(tuple(values))
        if key in seen:
            raise check.error(
                "key is both upserted and deleted in one epoch; the order is ambiguous",
                ",".join(schema.key),
                _shown_key(key),
            )
        if key not in deleted:
            deleted.add(key)
            delete_keys.append(tuple(values))
    return ValidatedBatch(columns=columns, rows=rows, arrow=arrow, delete_keys=delete_keys)


def _hashable(key: tuple[Any, ...]) -> Any:
    try:
        hash(key)
    except TypeError:
        return repr(key)
    return key


def _shown_key(key: Any) -> Any:
    return key[0] if isinstance(key, tuple) and len(key) == 1 else key


def _strictly_increasing(column: pa.ChunkedArray) -> bool:
    """True for sorted unique integer keys (the usual case): O(n), no hashing."""
    if not pa.types.is_integer(column.type) or len(column) < 2:
        return len(column) < 2
    values = column.combine_chunks()
    return bool(pc.all(pc.greater(values[1:], values[:-1])).as_py())


def _validate_arrow(
    check: _Checker,
    schema: TableSchema,
    tables: list[pa.Table],
    columns: tuple[str, ...],
    seen: dict[Any, int],
) -> pa.Table:
    """Validate the Arrow upserts with Arrow compute kernels (no per-row Python)."""
    try:
        parts = [t.select(list(columns)) for t in tables]
        table = pa.concat_tables(parts, promote_options="default")
    except (pa.ArrowInvalid, pa.ArrowTypeError) as err:
        raise check.error(f"the Arrow tables of this epoch do not share a schema: {err}") from None
    for name in columns:
        col = schema.columns[name]
        typ = table.schema.field(name).type
        if col.kind == "bytes" and not pa.types.is_null(typ):
            raise check.error(
                "bytea columns are not supported in Arrow batches; stage dict rows", name
            )
        if not _arrow_fits(col, typ):
            raise check.error(f"incompatible type: Arrow {typ} for {col.sql_type}", name, str(typ))
        nulls = table.column(name).null_count
        if nulls and (name in schema.key or col.not_null):
            first = pc.index(pc.is_null(table.column(name)), True).as_py()
            what = "key" if name in schema.key else "NOT NULL"
            raise check.error(f"NULL in {what} column (Arrow row {first})", name, None)
    keys = list(schema.key)
    if len(keys) == 1:
        column = table.column(keys[0])
        duplicated = not _strictly_increasing(column)
        if duplicated:  # the fast check failed: count (hash) to be sure
            duplicated = pc.count_distinct(column).as_py() != table.num_rows
    else:
        duplicated = True
    if duplicated:
        counts = table.select(keys).group_by(keys).aggregate([([], "count_all")])
        dups = counts.filter(pc.greater(counts.column("count_all"), 1))
        if dups.num_rows:
            value = tuple(dups.column(k)[0].as_py() for k in keys)
            raise check.error(
                "duplicate key among the epoch's upserts (Arrow rows)",
                ",".join(keys),
                _shown_key(value),
            )
    if seen:
        for row in table.select(keys).to_pylist():
            key = _hashable(tuple(row[k] for k in keys))
            if key in seen:
                raise check.error(
                    "duplicate key among the epoch's upserts (a dict row and an Arrow row)",
                    ",".join(keys),
                    _shown_key(key),
                )
    return table
