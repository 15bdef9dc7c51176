"""What a key column may be: a type whose equality is the same wherever keys are compared.

Keys are compared in the sink (SQL equality, ``ON CONFLICT``, its primary key),
in the expected-state store (Arrow joins and merges by key) and through the
row hash. Floating-point key columns are refused, everywhere a key is first
declared (the store's schema, the Postgres and SQL sinks' targets):

- PostgreSQL holds 0.0 and -0.0 as one key (they are equal), Arrow's joins and
  the stored bytes as two. A row keyed by -0.0 is one row in the sink and two
  in the store, so verify would report drift for ever and repair would fail
  for ever.
- PostgreSQL also treats NaN as equal to NaN (one key); Arrow's joins do not
  match NaN with NaN.

Normalizing -0.0 to 0.0 would mend the first case only; NaN, and a key a
driver rounds on the way in, would remain. An exact type (an integer,
``numeric``/decimal, text, a timestamp) has none of these problems, so the
error points to one.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
import pyarrow.compute as pc  # type: ignore[import-untyped, unused-ignore]

from reconcile.core.contract import InvalidInputError

__all__ = [
    "FLOAT_SQL_TYPES",
    "all_distinct",
    "check_arrow_keys",
    "check_sql_keys",
    "float_key_error",
]

# PostgreSQL's names for its floating-point types, as format_type() and
# information_schema give them (float(p) is one of these two).
FLOAT_SQL_TYPES = frozenset({"real", "double precision", "float4", "float8", "float"})


def float_key_error(
    where: str, column: str, type_name: str, error: type[InvalidInputError] = InvalidInputError
) -> InvalidInputError:
    """The error for a floating-point key column ``column`` of ``where``."""
    return error(
        f"{where}: key column {column!r} is of the floating-point type {type_name}, which cannot "
        "key rows exactly (0.0 and -0.0 are one key in PostgreSQL but two in the expected "
        "state, and NaN matches NaN in one and not the other). Key the table by an integer, "
        "numeric/decimal or text column instead; nothing was written",
        table=where,
        column=column,
    )


def check_arrow_keys(where: str, schema: pa.Schema, keys: Iterable[str]) -> None:
    """Raise InvalidInputError if a key column of ``schema`` is floating-point."""
    for key in keys:
        if key in schema.names and pa.types.is_floating(schema.field(key).type):
            raise float_key_error(where, key, str(schema.field(key).type))


def check_sql_keys(
    where: str,
    types: dict[str, str],
    keys: Iterable[str],
    error: type[InvalidInputError] = InvalidInputError,
) -> None:
    """Raise ``error`` if a key column's SQL type (``types``: column -> type name) is a float."""
    for key in keys:
        type_name = types.get(key, "").lower()
        if type_name in FLOAT_SQL_TYPES or type_name.startswith("float"):
            raise float_key_error(where, key, type_name, error)


def all_distinct(column: pa.ChunkedArray | pa.Array) -> bool:
    """Whether no value of a key column repeats (NULLs count as one value).

    Sorted unique integers (the usual key) are seen in one pass; other
    integers are sorted; anything else is hashed by ``pc.unique``. Arrow's
    ``count_distinct`` hashes too, but took several times longer than either
    on ten million keys here.
    """
    if len(column) < 2:
        return True
    if pa.types.is_integer(column.type) and column.null_count == 0:
        values = np.asarray(column.to_numpy() if isinstance(column, pa.Array)
                            else column.combine_chunks().to_numpy())  # fmt: skip
        if bool(np.all(values[1:] > values[:-1])):
            return True
        ordered = np.sort(values)
        return bool(np.all(ordered[1:] != ordered[:-1]))
    return len(pc.unique(column)) == len(column)
