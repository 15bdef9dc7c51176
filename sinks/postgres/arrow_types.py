"""PostgreSQL column types as the engine holds them: one registry, read by the code and the docs.

``PG_TYPES`` has one entry per type (by ``pg_type.typname``): the Arrow type the
expected-state store keeps it as, the value form both sides put its values in
(``reconcile.core.value_forms``), its kind for pull-and-diff, and what
``docs/types.md`` says of it (``sinks.types_doc`` renders it from here). A
type not in the registry (time, interval, arrays, enums, domains, money, ...),
a ``numeric(p, s)`` wider than 38 digits or with a scale outside 0..p, has no
type the row hash takes: the sink reports it as refused (schema metadata of
``arrow_schema()``), and the store refuses a row that gives such a column,
naming the table, the column and the type, before anything is written.

A ``numeric`` without precision holds any number of digits, which no Arrow
decimal does; it is recorded as ``decimal128(38, 18)`` (20 digits before the
point, 18 after: Spark's choice for an unbounded decimal), and a value beyond
it is refused when the epoch is staged, naming both types. ``_epoch`` (written
by the sink) and columns the database writes itself (GENERATED ALWAYS) are left
out.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]

from reconcile.core.decimals import arrow_decimal_type
from reconcile.core.type_table import ColumnType
from reconcile.core.value_forms import ValueForm, with_form, with_refused

from .schema import EPOCH_COLUMN, Column, TableSchema

__all__ = [
    "PG_TYPES",
    "UNBOUNDED_NUMERIC",
    "PgType",
    "arrow_type",
    "column_form",
    "recovery_kind",
    "refusal",
    "target_arrow_schema",
]

# The store's type for a numeric column declared without precision.
UNBOUNDED_NUMERIC = pa.decimal128(38, 18)

_INT = "int (not bool), in the type's range"
_INTS = "any integer type"
_TEXT_ARROW = "string, large_string"


@dataclass(frozen=True)
class PgType:
    """How the engine holds one PostgreSQL type.

    Attributes:
        typnames: the ``pg_type.typname`` values it covers.
        doc: its row of the type table.
        store: the store's Arrow type, or a function of the column (None: refused).
        form: the column's value form, a function of the column (None: none).
        kind: its pull-and-diff kind (``reconcile.core.conform.SinkColumn``).
    """

    typnames: tuple[str, ...]
    doc: ColumnType
    store: pa.DataType | Callable[[Column], pa.DataType | None] | None
    form: Callable[[Column], ValueForm | None] | None = None
    kind: str = "other"


def _numeric(column: Column) -> pa.DataType | None:
    precision, scale = column.numeric_bounds
    if precision is None:
        return UNBOUNDED_NUMERIC
    decimal = arrow_decimal_type(precision, scale or 0)
    return decimal if decimal is not None and precision <= 38 else None


def _fraction(column: Column) -> ValueForm | None:
    # timestamp(p)'s typmod is p; the server rounds a finer value to it.
    return ValueForm("fraction", column.typmod) if 0 <= column.typmod < 6 else None


def _bpchar(column: Column) -> ValueForm:
    return ValueForm("bpchar", column.max_length)


def _fixed(form: str) -> Callable[[Column], ValueForm]:
    return lambda _column: ValueForm(form)


def _int(sql: str, store: pa.DataType) -> PgType:
    name = {"int2": "smallint", "int4": "integer", "int8": "bigint"}[sql]
    doc = ColumnType(name, str(store), _INT, _INTS, f"binary COPY ({name})", "the integer")
    return PgType((sql,), doc, store, kind="int")


# fmt: off
_WIDE_NUMERIC = ColumnType("numeric(p, s), p > 38 or s < 0 or s > p", refused="no decimal the "
                           "row hash takes (at most 38 digits, a scale of 0 to p)")

PG_TYPES: tuple[PgType, ...] = (
    _int("int2", pa.int16()),
    _int("int4", pa.int32()),
    _int("int8", pa.int64()),
    PgType(("numeric",), ColumnType(
        "numeric(p, s), p ≤ 38, 0 ≤ s ≤ p; numeric", "decimal128(p, s); decimal128(38, 18)",
        "Decimal, int, float: only if it fits exactly (never rounded)",
        "integers, floats, decimals (checked to fit exactly)", "binary COPY (numeric)",
        "the decimal (its unscaled integer)",
    ), _numeric, kind="numeric"),
    PgType(("float4",), ColumnType(
        "real", "float32", "float, int; NaN, ±inf, -0.0 too", "integers, floats",
        "binary COPY (float4)", "float32: -0.0 as 0.0, every NaN as one",
    ), pa.float32(), kind="float4"),
    PgType(("float8",), ColumnType(
        "double precision", "float64", "float, int; NaN, ±inf, -0.0 too", "integers, floats",
        "binary COPY (float8)", "float64: -0.0 as 0.0, every NaN as one",
    ), pa.float64(), kind="float8"),
    PgType(("bool",), ColumnType(
        "boolean", "bool", "bool", "bool", "binary COPY (bool)", "bool",
    ), pa.bool_(), kind="bool"),
    PgType(("text",), ColumnType(
        "text", "string", "str (no NUL)", _TEXT_ARROW, "binary COPY (text)", "the UTF-8 text",
    ), pa.string(), kind="text"),
    PgType(("varchar",), ColumnType(
        "varchar(n), varchar", "string", "str of at most n characters (no NUL)", _TEXT_ARROW,
        "binary COPY (text)", "the UTF-8 text (a longer value is refused by the sink)",
    ), pa.string(), kind="text"),
    PgType(("bpchar",), ColumnType(
        "char(n), character(n), bpchar", "string",
        "str of at most n characters, trailing blanks aside (no NUL)", _TEXT_ARROW,
        "binary COPY (as text; the server pads it)",
        "form `bpchar(n)`: the text padded with blanks to n characters, as the server "
        "stores and returns it; `bpchar` without n as given",
    ), pa.string(), _bpchar, kind="char"),
    PgType(("citext",), ColumnType(
        "citext", "string", "str (no NUL)", _TEXT_ARROW, "COPY (text form)",
        "the UTF-8 text as given (the server keeps it; only its comparisons ignore case, "
        "so keys that differ only in case are one key to it)",
    ), pa.string(), kind="text"),
    PgType(("uuid",), ColumnType(
        "uuid", "string", "uuid.UUID; str in any spelling (any case, {…}, urn:uuid:, hyphens "
        "anywhere); 16 bytes", "string (any spelling), fixed_size_binary(16), uuid",
        "binary COPY (its 16 bytes)", "form `uuid`: lowercase hyphenated text",
    ), pa.string(), _fixed("uuid"), kind="uuid"),
    PgType(("date",), ColumnType(
        "date", "date32", "datetime.date (not datetime)", "date32, date64",
        "binary COPY (date)", "days since 1970-01-01",
    ), pa.date32(), kind="date"),
    PgType(("timestamp",), ColumnType(
        "timestamp(p), timestamp", "timestamp[us]", "naive datetime.datetime",
        "timestamp without a time zone", "binary COPY (timestamp)",
        "microseconds, wall clock (form `fraction(p)` for p < 6: finer refused, never "
        "rounded)",
    ), pa.timestamp("us"), _fraction, kind="timestamp"),
    PgType(("timestamptz",), ColumnType(
        "timestamptz(p), timestamptz", "timestamp[us, tz=UTC]",
        "aware datetime.datetime (any zone)", "timestamp with a time zone",
        "binary COPY (timestamptz)",
        "microseconds since the epoch, UTC (form `fraction(p)` for p < 6)",
    ), pa.timestamp("us", tz="UTC"), _fraction, kind="timestamptz"),
    PgType(("bytea",), ColumnType(
        "bytea", "binary", "bytes, bytearray, memoryview",
        "none: give bytea columns as dict rows", "binary COPY (bytea)", "the bytes",
    ), pa.binary(), kind="bytes"),
    PgType(("json",), ColumnType(
        "json", "string",
        "str: JSON text (a document, not a JSON string); dict, list, int, float, Decimal, "
        "bool: JSON", "string (JSON text), struct, list",
        "binary COPY (json) of its jsonb text (key order, whitespace and duplicate keys of "
        "the given text are not kept)",
        "form `jsonb`: by meaning, as jsonb's text on both sides (the sink's value read "
        "as `::jsonb::text`)",
    ), pa.string(), _fixed("jsonb"), kind="jsonb"),
    PgType(("jsonb",), ColumnType(
        "jsonb", "string",
        "str: JSON text (a document, not a JSON string); dict, list, int, float, Decimal, "
        "bool: JSON",
        "string (JSON text), struct, list", "binary COPY (jsonb) of its canonical text",
        "form `jsonb`: PostgreSQL's own text of it (keys by length, then bytes; numbers "
        "as numeric prints them)",
    ), pa.string(), _fixed("jsonb"), kind="jsonb"),
    PgType(("time", "timetz"), ColumnType(
        "time, timetz", refused="the row hash takes no time of day (store it as text or an "
        "interval in microseconds)"), None),
    PgType(("interval",), ColumnType(
        "interval", refused="months, days and microseconds are three fields: no Arrow type "
        "holds one exactly"), None),
    PgType(("name",), ColumnType(
        "name", refused="PostgreSQL's identifier type cuts a value to 63 bytes without a word"
    ), None),
    PgType(("money",), ColumnType(
        "money", refused="its text and precision follow the server's lc_monetary"), None),
    PgType((), _WIDE_NUMERIC, None),
    PgType((), ColumnType(
        "arrays, enums, domains, composite and range types, xml, inet, cidr, macaddr, bit, "
        "geometric and every other type", refused="no type the row hash takes"), None),
)
# fmt: on

_BY_TYPNAME = {name: entry for entry in PG_TYPES for name in entry.typnames}


def arrow_type(column: Column) -> pa.DataType | None:
    """The Arrow type that holds every value of ``column`` exactly; None if there is none."""
    entry = _BY_TYPNAME.get(column.typname)
    if entry is None or entry.store is None:
        return None
    return entry.store(column) if callable(entry.store) else entry.store


@functools.lru_cache(maxsize=1024)
def column_form(column: Column) -> ValueForm | None:
    """The value form of ``column`` (``reconcile.core.value_forms``); None if it has none."""
    entry = _BY_TYPNAME.get(column.typname)
    if entry is None or entry.form is None:
        return None
    return entry.form(column)


def recovery_kind(typname: str) -> str:
    """The pull-and-diff kind of a type (``SinkColumn.kind``): ``other`` if it is not held."""
    entry = _BY_TYPNAME.get(typname)
    return "other" if entry is None else entry.kind


def refusal(column: Column) -> str | None:
    """Why the engine cannot hold ``column``'s values exactly; None if it can."""
    if arrow_type(column) is not None:
        return None
    entry = _BY_TYPNAME.get(column.typname)
    why = entry.doc.refused if entry is not None else "no type the row hash takes"
    if column.typname == "numeric":
        why = _WIDE_NUMERIC.refused
    return f"{column.sql_type} ({why})"


def target_arrow_schema(table: TableSchema) -> pa.Schema:
    """The columns a writer gives, as Arrow types, each with its SQL type as ``sql_type``.

    A column with a value form names it (``value_form``); the columns of a type
    the engine cannot hold are named, with why, in the schema's metadata
    (``reconcile.core.value_forms.refused_columns``).
    """
    fields = []
    refused = {}
    for name, column in table.columns.items():
        if name == EPOCH_COLUMN or column.written_by_database is not None:
            continue
        dtype = arrow_type(column)
        if dtype is None:
            refused[name] = refusal(column) or column.sql_type
            continue
        field = pa.field(name, dtype, metadata={"sql_type": column.sql_type})
        fields.append(with_form(field, column_form(column)))
    return with_refused(pa.schema(fields), refused)
