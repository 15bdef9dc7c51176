"""MariaDB (and MySQL) column types as the SQL sink holds them: one registry, read by code and docs.

``MARIADB_TYPES`` has one entry per type, by the class SQLAlchemy reflects it
as (``type(column.type).__name__``): the Arrow type the expected-state store
keeps, the value form both sides put its values in
(``reconcile.core.value_forms``), and its row of ``docs/types.md``
(``sinks.types_doc`` renders it). A type not in the registry, or one an entry
refuses, has no type the row hash takes: ``arrow_types.table_arrow_schema``
names it as refused, and the store refuses a row that gives such a column,
naming the table, the column and the type, before anything is written.

What the server does that the forms make exact (each seen on a real server):

- ``CHAR(n)`` gives its values back without trailing blanks (``rtrim(n)``);
  ``VARCHAR(n)`` cuts blanks past ``n`` with only a note, even in strict mode
  (``maxlen(n)``: a longer value is refused); ``BINARY(n)`` pads with NUL
  bytes (``zeropad(n)``);
- ``DATETIME(p)`` and ``TIMESTAMP(p)`` with ``p < 6`` drop finer fractions of a
  second without a word (``fraction(p)``: refused). Without it, two keys of a
  ``DATETIME`` key column that differ in their microseconds would be written
  as one row;
- ``FLOAT`` is 4 bytes (float32), and the server sends it as text rounded to 6
  digits: the pull reads it as a double (``v + 0e0``), which is exact;
- neither float type stores NaN or an infinity (``finite``);
- ``UUID`` reads back lowercase and hyphenated (``uuid``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
import sqlalchemy as sa

from reconcile.core.decimals import arrow_decimal_type
from reconcile.core.type_table import ColumnType
from reconcile.core.value_forms import ValueForm

__all__ = ["MARIADB_TYPES", "SqlType", "mariadb_arrow_type", "mariadb_form", "mariadb_refusal"]

_Type = sa.types.TypeEngine[Any]
_PARAM = "a bound parameter (PyMySQL)"
_TEXT = "str"
_ROWS = "any a batch may hold: a batch is taken as its Python values"
_SIGNED_INT = "int (not bool), in the column's range"


@dataclass(frozen=True)
class SqlType:
    """How the SQL sink holds one MariaDB type.

    Attributes:
        classes: the SQLAlchemy class names it is reflected as.
        doc: its row of the type table.
        store: the store's Arrow type, or a function of the column's type (None: refused).
        form: the column's value form, a function of its type (None: none).
    """

    classes: tuple[str, ...]
    doc: ColumnType
    store: pa.DataType | Callable[[_Type], pa.DataType | None] | None
    form: Callable[[_Type], ValueForm | None] | None = None


def _unsigned(t: _Type) -> bool:
    return bool(getattr(t, "unsigned", False))


def _decimal(t: _Type) -> pa.DataType | None:
    precision, scale = getattr(t, "precision", None), getattr(t, "scale", None)
    if precision is None:
        return pa.decimal128(38, 18)
    decimal = arrow_decimal_type(precision, scale or 0)
    return decimal if decimal is not None and precision <= 38 else None


def _float(dtype: pa.DataType) -> Callable[[_Type], pa.DataType | None]:
    # FLOAT(M,D) and DOUBLE(M,D) round every value to D decimals without a word.
    return lambda t: None if getattr(t, "scale", None) is not None else dtype


def _fraction(t: _Type) -> ValueForm | None:
    fsp = getattr(t, "fsp", None) or 0
    return ValueForm("fraction", fsp) if fsp < 6 else None


def _sized(name: str) -> Callable[[_Type], ValueForm | None]:
    return lambda t: ValueForm(name, getattr(t, "length", None))


def _fixed(name: str) -> Callable[[_Type], ValueForm]:
    return lambda _t: ValueForm(name)


def _int(classes: tuple[str, ...], sql: str, signed: pa.DataType, unsigned: pa.DataType,
         note: str = "") -> SqlType:  # fmt: skip
    doc = ColumnType(sql, f"{signed}; UNSIGNED: {unsigned}", _SIGNED_INT + note, _ROWS, _PARAM,
                     "the integer")  # fmt: skip
    return SqlType(classes, doc, lambda t: unsigned if _unsigned(t) else signed)


# fmt: off
_REFUSED_FLOAT = ColumnType("FLOAT(M,D), DOUBLE(M,D)", refused="the server rounds each value "
                            "to D decimals without a word")
_WIDE_DECIMAL = ColumnType("DECIMAL(p, s), p > 38", refused="no decimal the row hash takes "
                           "(at most 38 digits)")

MARIADB_TYPES: tuple[SqlType, ...] = (
    SqlType(("BOOLEAN",), ColumnType(
        "BOOLEAN (TINYINT(1))", "bool", "bool", _ROWS, _PARAM, "bool",
    ), pa.bool_()),
    _int(("TINYINT",), "TINYINT", pa.int32(), pa.int32()),
    _int(("SMALLINT",), "SMALLINT", pa.int16(), pa.int32()),
    _int(("MEDIUMINT",), "MEDIUMINT", pa.int32(), pa.int32()),
    _int(("INTEGER",), "INT", pa.int32(), pa.int64()),
    _int(("BIGINT",), "BIGINT", pa.int64(), pa.int64(),
         "; UNSIGNED: 2^63 and above refused (int64 cannot hold it)"),
    SqlType(("DECIMAL", "NUMERIC"), ColumnType(
        "DECIMAL(p, s), p ≤ 38", "decimal128(p, s)",
        "Decimal, int, float: only if it fits exactly (never rounded)", _ROWS, _PARAM,
        "the decimal (its unscaled integer)",
    ), _decimal),
    SqlType(("FLOAT",), ColumnType(
        "FLOAT", "float32 (float)", "float, int (no NaN, no infinity)", _ROWS, _PARAM,
        "float32 (form `finite`), read as a double (`v + 0e0`): the server's text of it has 6 "
        "digits",
    ), _float(pa.float32()), _fixed("finite")),
    SqlType(("DOUBLE", "REAL", "DOUBLE_PRECISION"), ColumnType(
        "DOUBLE, REAL", "float64 (double)", "float, int (no NaN, no infinity)", _ROWS, _PARAM,
        "float64 (form `finite`)",
    ), _float(pa.float64()), _fixed("finite")),
    SqlType(("CHAR", "NCHAR"), ColumnType(
        "CHAR(n)", "string", f"{_TEXT} of at most n characters, trailing blanks aside", _ROWS,
        _PARAM, "form `rtrim(n)`: without trailing blanks, as the server gives it back",
    ), pa.string(), _sized("rtrim")),
    SqlType(("VARCHAR", "NVARCHAR"), ColumnType(
        "VARCHAR(n)", "string", f"{_TEXT} of at most n characters, blanks included", _ROWS,
        _PARAM, "form `maxlen(n)`: the text (a longer one refused: the server would cut "
        "trailing blanks with only a note)",
    ), pa.string(), _sized("maxlen")),
    SqlType(("TINYTEXT", "TEXT", "MEDIUMTEXT", "LONGTEXT", "ENUM"), ColumnType(
        "TINYTEXT, TEXT, MEDIUMTEXT, LONGTEXT, JSON, ENUM", "string",
        f"{_TEXT} (JSON: its text, kept as given; ENUM: one of its values)", _ROWS, _PARAM,
        "the UTF-8 text",
    ), pa.string()),
    SqlType(("UUID",), ColumnType(
        "UUID", "string", "str in any case, with or without hyphens (the server takes no "
        "braces, and the driver no uuid.UUID)", _ROWS,
        _PARAM, "form `uuid`: lowercase hyphenated text",
    ), pa.string(), _fixed("uuid")),
    SqlType(("BINARY",), ColumnType(
        "BINARY(n)", "binary", "bytes of at most n", _ROWS, _PARAM,
        "form `zeropad(n)`: padded with NUL bytes to n, as the server stores it",
    ), pa.binary(), _sized("zeropad")),
    SqlType(("VARBINARY", "TINYBLOB", "BLOB", "MEDIUMBLOB", "LONGBLOB"), ColumnType(
        "VARBINARY(n), TINYBLOB, BLOB, MEDIUMBLOB, LONGBLOB", "binary",
        "bytes, bytearray, memoryview", _ROWS, _PARAM, "the bytes",
    ), pa.binary()),
    SqlType(("DATE",), ColumnType(
        "DATE", "date32", "datetime.date (not datetime)", _ROWS, _PARAM,
        "days since 1970-01-01",
    ), pa.date32()),
    SqlType(("DATETIME", "TIMESTAMP"), ColumnType(
        "DATETIME(p), TIMESTAMP(p)", "timestamp[us]", "naive datetime.datetime (TIMESTAMP: UTC)",
        _ROWS, f"{_PARAM}, in a session whose time zone is UTC",
        "microseconds, wall clock (form `fraction(p)` for p < 6, DATETIME's default 0: a "
        "finer value is refused, key or not, never cut)",
    ), pa.timestamp("us"), _fraction),
    SqlType((), _WIDE_DECIMAL, None),
    SqlType((), _REFUSED_FLOAT, None),
    SqlType(("SET",), ColumnType(
        "SET", refused="the server reorders and merges its members, and the driver reads a "
        "Python set"), None),
    SqlType(("TIME",), ColumnType(
        "TIME", refused="the row hash takes no time of day (store it as text or as "
        "microseconds)"), None),
    SqlType(("YEAR",), ColumnType(
        "YEAR", refused="two-digit years are read as four; store it as SMALLINT"), None),
    SqlType(("BIT",), ColumnType("BIT(n)", refused="read back as bytes, written as an "
                                 "integer: no one type holds it"), None),
    SqlType((), ColumnType(
        "INET4, INET6, GEOMETRY and every other type", refused="no type the row hash takes",
    ), None),
)
# fmt: on

_BY_CLASS = {name: entry for entry in MARIADB_TYPES for name in entry.classes}


def _entry(t: _Type) -> SqlType | None:
    # BOOLEAN is TINYINT(1) on these servers: the width tells (arrow_types.is_boolean).
    if type(t).__name__ == "TINYINT" and getattr(t, "display_width", None) == 1:
        return _BY_CLASS["BOOLEAN"]
    return _BY_CLASS.get(type(t).__name__)


def mariadb_arrow_type(t: _Type) -> pa.DataType | None:
    """The Arrow type that holds every value of a column of type ``t`` exactly; None if none."""
    entry = _entry(t)
    if entry is None or entry.store is None:
        return None
    return entry.store(t) if callable(entry.store) else entry.store


def mariadb_form(t: _Type) -> ValueForm | None:
    """The value form of a column of type ``t`` (``reconcile.core.value_forms``); None if none."""
    entry = _entry(t)
    if entry is None or entry.form is None or mariadb_arrow_type(t) is None:
        return None
    return entry.form(t)


def mariadb_refusal(t: _Type) -> str | None:
    """Why the engine cannot hold a column of type ``t`` exactly; None if it can."""
    if mariadb_arrow_type(t) is not None:
        return None
    entry = _entry(t)
    why = entry.doc.refused if entry is not None else "no type the row hash takes"
    name = type(t).__name__
    if name in ("DECIMAL", "NUMERIC"):
        why = _WIDE_DECIMAL.refused
    elif name in ("FLOAT", "DOUBLE", "REAL", "DOUBLE_PRECISION"):
        why = _REFUSED_FLOAT.refused
    return why
