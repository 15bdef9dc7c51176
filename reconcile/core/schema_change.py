"""Which changes of a sink table's schema evolve in place, and the change a pipeline asks for.

A transform's output may change between epochs. Some changes can be made to
the expected-state store and to the sink's table in place, under the fence,
as part of the first epoch that carries them; the others need the sink
rebuilt. The rules are pure (Arrow types in, a decision out) and shared by the
store, the commit cycle and the sinks, so that all of them agree:

- a new value column, nullable: rows written before read NULL in it;
- a wider integer: int16 -> int32 -> int64;
- a wider float: float32 -> float64;
- a wider decimal: decimal(p,s) -> decimal(p',s') with p'-s' >= p-s and s' >= s
  (every old value keeps its digits on both sides of the point);
- a longer string: a sink type declared as field metadata ``sql_type``
  (``varchar(10)`` -> ``varchar(40)`` or ``text``); the Arrow type stays string.

Everything else is refused before anything is written, naming the table and
the column: a key column dropped or retyped, a value column dropped, a
narrowing or any other retyping, a new column declared NOT NULL (it has no
value for the rows already written).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]

from reconcile.core.errors import InvalidInputError

__all__ = [
    "ADDED_EPOCH",
    "REBUILD",
    "SQL_TYPE_KEY",
    "ForeignSchemaChange",
    "SchemaChange",
    "SchemaChangeRefused",
    "added_epoch",
    "declared_length",
    "declared_sql_type",
    "plan_schema_change",
    "widens",
]

# What a refusal tells the operator to do instead.
REBUILD = "rebuild the sink (docs/changing.md)"
# Field metadata key: a sink column's own type, as a schema declares it (``text``).
SQL_TYPE_KEY = b"sql_type"
# Field metadata of a store column that an epoch added (that epoch's number); a
# column without it has been in the table since its first epoch.
ADDED_EPOCH = b"reconcile.added_epoch"

_VARCHAR = re.compile(r"^\s*(?:varchar|character varying)\s*\(\s*(\d+)\s*\)\s*$", re.IGNORECASE)
_TEXT = re.compile(r"^\s*(?:text|varchar|character varying)\s*$", re.IGNORECASE)


class SchemaChangeRefused(InvalidInputError):
    """A schema change that cannot be made in place; nothing was written."""


class ForeignSchemaChange(SchemaChangeRefused):
    """A sink table's columns changed by someone other than the engine; nothing was written.

    Its details name the table, the column and ``change``: ``dropped``,
    ``retyped`` or ``added``.
    """


@dataclass(frozen=True)
class SchemaChange:
    """A change of a table's user schema that evolves in place.

    Attributes:
        table: how messages name the table (the store table, or the sink).
        before: the user schema now (keys and values).
        after: the user schema the epoch brings; a field may carry its sink
            type as metadata ``sql_type``.
        added: the new columns, in order.
        widened: the columns whose type (Arrow, or declared sink type) widens.
    """

    table: str
    before: pa.Schema
    after: pa.Schema
    added: tuple[str, ...]
    widened: tuple[str, ...]

    @property
    def columns(self) -> tuple[str, ...]:
        """Every column the change touches: the new ones, then the widened ones."""
        return self.added + self.widened

    def describe(self) -> str:
        """The change in words: ``adds 'note' (string); widens 'qty' int32 -> int64``."""
        parts = [f"adds {n!r} ({self.after.field(n).type})" for n in self.added]
        for name in self.widened:
            old, new = self.before.field(name), self.after.field(name)
            shown_old = declared_sql_type(old) or str(old.type)
            shown_new = declared_sql_type(new) or str(new.type)
            parts.append(f"widens {name!r} {shown_old} -> {shown_new}")
        return "; ".join(parts)


def added_epoch(field: pa.Field) -> int | None:
    """The epoch that added a store column (its ``ADDED_EPOCH``); None: there from the start."""
    found = (field.metadata or {}).get(ADDED_EPOCH)
    return None if found is None else int(found)


def declared_sql_type(field: pa.Field) -> str | None:
    """The sink type a field declares in its metadata (``sql_type``), if any."""
    found = (field.metadata or {}).get(SQL_TYPE_KEY)
    return None if found is None else found.decode()


def declared_length(sql_type: str | None) -> int | bool | None:
    """A declared string type's length: n for ``varchar(n)``; None for ``text``; False else."""
    if sql_type is None:
        return False
    match = _VARCHAR.match(sql_type)
    if match:
        return int(match.group(1))
    return None if _TEXT.match(sql_type) else False


def widens(old: pa.DataType, new: pa.DataType) -> bool:
    """Whether changing a column from ``old`` to ``new`` keeps every value: a widening.

    Equal types are not a widening. Integers widen only signed to wider signed
    (int16 -> int32 -> int64), floats float32 -> float64, decimals when neither
    side of the point loses a digit.
    """
    t = pa.types
    if old.equals(new):
        return False
    if t.is_signed_integer(old) and t.is_signed_integer(new):
        return bool(new.bit_width > old.bit_width)
    if t.is_floating(old) and t.is_floating(new):
        return bool(new.bit_width > old.bit_width)
    if t.is_decimal(old) and t.is_decimal(new):
        digits = new.precision - new.scale >= old.precision - old.scale
        return bool(digits and new.scale >= old.scale)
    return False


def _string_widens(old: pa.Field, new: pa.Field) -> bool | None:
    """A declared string type that grows (True), stays (None) or shrinks (False)."""
    wanted = declared_length(declared_sql_type(new))
    if wanted is False:
        return None  # nothing declared: the sink keeps its type
    had = declared_length(declared_sql_type(old))
    if had is False or had == wanted:
        # The store keeps no sink type: whether the sink's column grows is the
        # sink's to decide against its own column (it refuses a shrink).
        return True if had is False else None
    if had is None:
        return False  # text -> varchar(n)
    return wanted is None or wanted > had


def _refuse(table: str, column: str, why: str) -> SchemaChangeRefused:
    return SchemaChangeRefused(
        f"table {table!r}: column {column!r} {why}; this cannot be evolved in place: "
        f"{REBUILD}; nothing was written",
        table=table,
        column=column,
    )


def plan_schema_change(
    before: pa.Schema, after: pa.Schema, keys: Sequence[str], *, table: str
) -> SchemaChange | None:
    """The change from ``before`` to ``after``, if it evolves in place; None if there is none.

    Args:
        before: the table's user schema now.
        after: the user schema an epoch brings (all its columns).
        keys: the key columns.
        table: how messages name the table.

    Returns:
        The change (new columns, widened columns), or None when ``after`` has
        the same columns and types (nullability and metadata aside, unless a
        declared string type grows).

    Raises:
        SchemaChangeRefused: naming the table and the first column that cannot
            change in place (see the module docstring); nothing was written.
    """
    for key in keys:
        if after.get_field_index(key) < 0:
            raise _refuse(table, key, "is a key column and the new schema drops it")
        if before.get_field_index(key) >= 0 and not before.field(key).type.equals(
            after.field(key).type
        ):
            raise _refuse(
                table,
                key,
                f"is a key column and the new schema retypes it "
                f"({before.field(key).type} -> {after.field(key).type})",
            )
    for field in before:
        if after.get_field_index(field.name) < 0:
            raise _refuse(table, field.name, "is dropped by the new schema")
    added: list[str] = []
    widened: list[str] = []
    for field in after:
        if before.get_field_index(field.name) < 0:
            if not field.nullable:
                raise _refuse(
                    table,
                    field.name,
                    "is new and NOT NULL: the rows already written have no value for it "
                    "(declare it nullable)",
                )
            added.append(field.name)
            continue
        old = before.field(field.name)
        if not old.type.equals(field.type):
            if not widens(old.type, field.type):
                raise _refuse(
                    table,
                    field.name,
                    f"changes type {old.type} -> {field.type}, which is not a widening "
                    "(int16 -> int32 -> int64, float32 -> float64, decimal(p,s) -> "
                    "decimal(p',s') with p'-s' >= p-s and s' >= s)",
                )
            widened.append(field.name)
        elif pa.types.is_string(field.type) or pa.types.is_large_string(field.type):
            grows = _string_widens(old, field)
            if grows is False:
                raise _refuse(
                    table,
                    field.name,
                    f"narrows its declared type {declared_sql_type(old)} -> "
                    f"{declared_sql_type(field)}",
                )
            if grows:
                widened.append(field.name)
    if not added and not widened:
        return None
    return SchemaChange(table, before, after, tuple(added), tuple(widened))
