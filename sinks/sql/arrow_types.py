"""A SQLAlchemy table's columns as Arrow types: what the expected-state store records them as.

By the reflected SQLAlchemy type (the same classes ``recovery.sink_kind`` reads):

=========================================  ====================================
SQLAlchemy type                            Arrow
=========================================  ====================================
Boolean                                    bool (MariaDB's and MySQL's BOOLEAN
                                           is TINYINT(1): bool there too)
SmallInteger, Integer, BigInteger          int16, int32, int64 (every integer
                                           is int64 on SQLite, which stores
                                           64-bit integers whatever the name)
Numeric(p, s), p <= 38, 0 <= s <= p        decimal128(p, s)
Numeric without precision                  decimal128(38, 18), as the Postgres
                                           sink's ``numeric``
Float, REAL, DOUBLE                        float64 (REAL is float32 except on
                                           SQLite, whose REAL is 8 bytes)
String, Text, Uuid                         string
Date                                       date32
DateTime                                   timestamp[us] (tz=UTC if timezone)
LargeBinary, BLOB, BYTEA                   binary
=========================================  ====================================

On MySQL and MariaDB the table is ``mariadb_types.MARIADB_TYPES`` instead (the
one ``docs/types.md`` shows): it also names each column's value form, and the
columns of a type the engine cannot hold are named, with why, in the schema's
metadata, for the store to refuse before anything is written.

Elsewhere, other types (JSON, Interval, Time, arrays, ...) have no type the row
hash takes and are left out: the store infers them from the values and refuses
those it cannot hash. ``_epoch``, which the sink writes itself, is left out too.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
import sqlalchemy as sa
from sqlalchemy.dialects import mysql

from reconcile.core.decimals import arrow_decimal_type
from reconcile.core.value_forms import with_form, with_refused

from .mariadb_types import mariadb_arrow_type, mariadb_form, mariadb_refusal

__all__ = ["MARIADB_DIALECTS", "arrow_type", "is_boolean", "table_arrow_schema"]

EPOCH_COLUMN = "_epoch"
MARIADB_DIALECTS = frozenset({"mysql", "mariadb"})


def _decimal(t: sa.Numeric[Any]) -> pa.DataType | None:
    if t.precision is None:
        return pa.decimal128(38, 18)
    decimal = arrow_decimal_type(t.precision, t.scale or 0)
    return decimal if decimal is not None and t.precision <= 38 else None


def is_boolean(t: sa.types.TypeEngine[Any], dialect: str) -> bool:
    """A boolean column: Boolean, or on MariaDB and MySQL the TINYINT(1) that BOOLEAN is there.

    Those servers keep no boolean type: ``BOOLEAN`` is a synonym of
    ``TINYINT(1)``, and the reflected type is that; the width is what tells.
    """
    if isinstance(t, sa.Boolean):
        return True
    return (
        dialect in ("mysql", "mariadb")
        and type(t).__name__ == "TINYINT"
        and getattr(t, "display_width", None) == 1
    )


def arrow_type(column: sa.Column[Any], dialect: str) -> pa.DataType | None:
    """The Arrow type that holds every value of ``column`` exactly; None if there is none."""
    t = column.type
    if dialect in MARIADB_DIALECTS:
        return mariadb_arrow_type(t)
    if is_boolean(t, dialect):
        return pa.bool_()
    if isinstance(t, sa.Integer):
        if dialect == "sqlite":
            return pa.int64()
        if isinstance(t, sa.SmallInteger):
            return pa.int16()
        return pa.int64() if isinstance(t, sa.BigInteger) else pa.int32()
    if isinstance(t, sa.Float):
        # Float is a subclass of Numeric: decided before it.
        return pa.float32() if isinstance(t, sa.REAL) and dialect != "sqlite" else pa.float64()
    if isinstance(t, sa.Numeric):
        return _decimal(t)
    if isinstance(t, sa.Uuid | sa.String):
        return pa.string()
    if isinstance(t, sa.DateTime):
        return pa.timestamp("us", tz="UTC" if t.timezone else None)
    if isinstance(t, sa.Date):
        return pa.date32()
    if isinstance(t, sa.LargeBinary):
        return pa.binary()
    name = type(t).__name__.upper()
    if name in ("REAL", "DOUBLE", "DOUBLE_PRECISION"):
        return pa.float64()
    if name in ("BLOB", "BYTEA"):
        return pa.binary()
    return None


def _spelled(column: sa.Column[Any], mariadb: bool) -> str:
    # The generic str() drops what errors must name on MariaDB: DATETIME(3)'s precision.
    return column.type.compile(dialect=mysql.dialect()) if mariadb else str(column.type)


def table_arrow_schema(table: sa.Table, dialect: str) -> pa.Schema:
    """The columns a writer gives, as Arrow types, each with its SQL type as ``sql_type``.

    On MySQL and MariaDB, a column with a value form names it, and the columns
    of a type the engine cannot hold are named in the schema's metadata
    (``reconcile.core.value_forms.refused_columns``).
    """
    fields = []
    refused = {}
    mariadb = dialect in MARIADB_DIALECTS
    for column in table.columns:
        if column.name == EPOCH_COLUMN or column.computed is not None:
            continue
        dtype = arrow_type(column, dialect)
        # A type SQLAlchemy does not know (INET6) reflects as NullType, whose str is "NULL".
        unknown = isinstance(column.type, sa.types.NullType)
        sql_type = "a type SQLAlchemy does not know" if unknown else _spelled(column, mariadb)
        if dtype is None:
            if mariadb:
                refused[column.name] = f"{sql_type} ({mariadb_refusal(column.type)})"
            continue
        field = pa.field(column.name, dtype, metadata={"sql_type": sql_type})
        fields.append(with_form(field, mariadb_form(column.type)) if mariadb else field)
    schema = pa.schema(fields)
    return with_refused(schema, refused) if refused else schema
