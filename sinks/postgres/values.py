"""Values against columns: coercing dict-row values, Arrow types that fit, row sizes, errors."""

from __future__ import annotations

import datetime as dt
import decimal
import uuid
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
from psycopg.types.json import Json, Jsonb

from reconcile.core.contract import RowsRejectedError
from reconcile.core.decimals import DecimalFitError, check_decimal
from reconcile.core.value_forms import FormError

from .arrow_types import column_form
from .schema import Column, TableSchema

__all__ = [
    "MAX_ROW_BYTES",
    "NOT_NULL",
    "NO_VALUE",
    "BadValue",
    "BatchErrors",
    "DumpedJson",
    "ValueMisfit",
    "approx_bytes",
    "arrow_type_fits",
    "coerce_value",
    "oversize",
]

_INT_RANGES = {"int2": 2**15, "int4": 2**31, "int8": 2**63}

# The largest row the sink sends. PostgreSQL refuses any protocol message or
# field value of 1 GB or more, and the text forms of COPY and of array
# parameters may double a value (quotes, backslashes, bytea hex). A larger row
# would fail on every retry, so it is refused before anything is written.
MAX_ROW_BYTES = 256 * 1024 * 1024


class DumpedJson:
    """A ``dumps`` for psycopg's Json wrappers that returns the text validation made."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __call__(self, _obj: Any) -> str:
        return self.text


def _bytes_text(size: int) -> str:
    return f"{size / 2**20:.0f} MiB" if size >= 2**20 else f"{size:,} bytes"


def oversize(where: str, size: int) -> str | None:
    """The error phrase for a row (``where``) of about ``size`` bytes; None if it may be sent."""
    if size <= MAX_ROW_BYTES:
        return None
    return (
        f"{where} is about {_bytes_text(size)}; the sink sends rows of at most "
        f"{_bytes_text(MAX_ROW_BYTES)} (PostgreSQL refuses any message or value of 1 GB, "
        "so it would fail on every retry)"
    )


def approx_bytes(value: Any) -> int:
    """About how many bytes a coerced value takes on the wire (an upper bound for text)."""
    if isinstance(value, str):
        # UTF-8 takes at most 4 bytes a character; isascii() is a fast C scan.
        return len(value) if value.isascii() else 4 * len(value)
    if isinstance(value, bytes):
        return 2 * len(value)  # hex in text form
    if isinstance(value, Json | Jsonb) and isinstance(value.dumps, DumpedJson):
        return approx_bytes(value.dumps.text)
    return 16


class BadValue(Exception):
    """A value of the wrong type for a column; the message says why."""

    @property
    def phrase(self) -> str:
        """How the error reads in a sink error."""
        return f"incompatible type: {self}"


class ValueMisfit(BadValue):
    """A value of the right type that the column cannot hold exactly."""

    @property
    def phrase(self) -> str:
        return str(self)


def coerce_value(col: Column, value: Any) -> Any:
    """Check a non-NULL Python value against a column and convert it for binary COPY."""
    kind = col.kind
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise BadValue(f"expected an integer for {col.sql_type}")
        bound = _INT_RANGES[col.typname]
        if not -bound <= value < bound:
            raise BadValue(f"out of range for {col.sql_type}")
        return value
    if kind in ("numeric", "float"):
        if isinstance(value, bool) or not isinstance(value, int | float | decimal.Decimal):
            raise BadValue(f"expected a number for {col.sql_type}")
        if kind == "float":
            return float(value)
        # The shared rule: PostgreSQL would round a value with more digits than
        # the declared scale without a word, and the expected state refuses it.
        try:
            return check_decimal(value, *col.numeric_bounds)
        except DecimalFitError as err:
            raise ValueMisfit(
                f"does not fit {col.sql_type} exactly: {err.reason}; it is refused rather "
                "than rounded"
            ) from None
    if kind == "bool":
        if not isinstance(value, bool):
            raise BadValue("expected a bool")
        return value
    if kind == "text":
        if not isinstance(value, str):
            raise BadValue(f"expected a str for {col.sql_type}")
        if "\x00" in value:
            raise BadValue("text cannot contain NUL characters")
        if col.typname == "bpchar":
            # Padded here as the server pads it: the expected state holds this form.
            return _formed(col, value)
        if col.max_length is not None and len(value) > col.max_length:
            raise BadValue(f"longer than {col.sql_type} allows")
        return value
    if kind == "uuid":
        # Any spelling, in the one form the store holds (reconcile.core.value_forms).
        return uuid.UUID(_formed(col, value))
    if kind == "date":
        if isinstance(value, dt.datetime) or not isinstance(value, dt.date):
            raise BadValue("expected a datetime.date")
        return value
    if kind in ("timestamp", "timestamptz"):
        if not isinstance(value, dt.datetime):
            raise BadValue("expected a datetime.datetime")
        aware = value.tzinfo is not None and value.utcoffset() is not None
        if kind == "timestamptz" and not aware:
            raise BadValue("naive datetime for timestamptz: give a timezone-aware datetime")
        if kind == "timestamp" and aware:
            raise BadValue("timezone-aware datetime for timestamp without time zone")
        return _formed(col, value)  # timestamp(p) would round a finer value: refused
    if kind == "time":
        if not isinstance(value, dt.time):
            raise BadValue("expected a datetime.time")
        return value
    if kind == "json":
        # A str is JSON text (not a JSON string); anything else is dumped. The
        # text sent is the one the expected state holds (its form): jsonb's
        # canonical text, for json too. Kept, so it is not dumped twice.
        text = _formed(col, value)
        wrapper = Jsonb if col.typname == "jsonb" else Json
        return wrapper(value, dumps=DumpedJson(text))
    if kind == "bytes":
        if not isinstance(value, bytes | bytearray | memoryview):
            raise BadValue("expected bytes")
        return bytes(value)
    if kind == "interval":
        if not isinstance(value, dt.timedelta):
            raise BadValue("expected a datetime.timedelta")
        return value
    if not isinstance(value, str):
        raise BadValue(f"type {col.sql_type} takes its text form: give a str")
    return value


def _formed(col: Column, value: Any) -> Any:
    """``value`` in the column's value form (as is without one); a misfit says why."""
    form = column_form(col)
    if form is None:
        return value
    try:
        return form.of_python(value)
    except FormError as err:
        raise ValueMisfit(f"does not fit {col.sql_type}: {err.reason}") from None


def arrow_type_fits(col: Column, typ: pa.DataType) -> bool:
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


NO_VALUE: Any = object()
# The SQLSTATE the server gives a NULL in a NOT NULL column (not_null_violation).
NOT_NULL = "23502"


class BatchErrors:
    """Builds the errors: each names the sink, the table, the column and the value."""

    def __init__(self, sink: str, schema: TableSchema, epoch: int) -> None:
        self.sink, self.schema, self.epoch = sink, schema, epoch

    def error(
        self, what: str, column: str | None = None, value: Any = NO_VALUE, *, sqlstate: str = ""
    ) -> RowsRejectedError:
        """The epoch's rows refused before anything is sent: a rejection, as the server's.

        ``sqlstate``: the one the server would have given (23502 for a NULL in
        a NOT NULL column), "" where no single one fits.
        """
        where = f" column {column!r}" if column is not None else ""
        shown = f" value {value!r:.200}" if value is not NO_VALUE else ""
        return RowsRejectedError(
            f"postgres sink {self.sink!r}, table {self.schema.display}{where}{shown}: {what} "
            f"(epoch {self.epoch}); nothing was written",
            sink=self.sink,
            table=self.schema.display,
            column=column,
            value=None if value is NO_VALUE else repr(value)[:200],
            epoch=self.epoch,
            sqlstate=sqlstate,
        )
