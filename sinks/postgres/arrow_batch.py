"""Validating an epoch's Arrow upserts with Arrow compute kernels (no per-row Python)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
import pyarrow.compute as pc  # type: ignore[import-untyped, unused-ignore]

from reconcile.core.decimals import DecimalFitError, check_decimal_array
from reconcile.core.keys import all_distinct
from reconcile.core.value_forms import FormError

from . import values
from .arrow_types import column_form
from .schema import TableSchema
from .values import NOT_NULL, BatchErrors, arrow_type_fits

__all__ = ["arrow_row_bytes", "hashable_key", "shown_key", "validate_arrow"]


def shown_key(key: Any) -> Any:
    """A one-column key shown as its value, a composite key as its tuple."""
    return key[0] if isinstance(key, tuple) and len(key) == 1 else key


def hashable_key(key: tuple[Any, ...]) -> Any:
    """The key itself if hashable, else its repr (for duplicate detection)."""
    try:
        hash(key)
    except TypeError:
        return repr(key)
    return key


def arrow_row_bytes(table: pa.Table) -> np.ndarray[Any, np.dtype[np.int64]]:
    """About how many bytes each row takes on the wire: variable-width lengths plus 16 a field."""
    sizes = np.full(table.num_rows, 16 * max(1, table.num_columns), dtype=np.int64)
    for column in table.columns:
        typ = column.type
        if pa.types.is_dictionary(typ):
            column = column.cast(typ.value_type)
            typ = column.type
        if pa.types.is_string(typ) or pa.types.is_large_string(typ):
            lengths = pc.fill_null(pc.binary_length(column), 0)
            sizes += np.asarray(lengths.to_numpy(zero_copy_only=False), dtype=np.int64)
        elif pa.types.is_binary(typ) or pa.types.is_large_binary(typ):
            lengths = pc.fill_null(pc.binary_length(column), 0)
            sizes += 2 * np.asarray(lengths.to_numpy(zero_copy_only=False), dtype=np.int64)
    return sizes


def _check_row_sizes(check: BatchErrors, table: pa.Table) -> None:
    """Refuse a row too large to send (skipped when the whole table is smaller)."""
    if table.nbytes <= values.MAX_ROW_BYTES:
        return
    sizes = arrow_row_bytes(table)
    biggest = int(np.argmax(sizes))
    if (too_large := values.oversize(f"Arrow row {biggest}", int(sizes[biggest]))) is not None:
        raise check.error(too_large)


def _formed(check: BatchErrors, schema: TableSchema, table: pa.Table) -> pa.Table:
    """Columns with a value form in that form (``reconcile.core.value_forms``), as the
    expected state holds them: the text COPY then sends is what the server gives back."""
    for index, name in enumerate(table.column_names):
        form, typ = column_form(schema.columns[name]), table.schema.field(index).type
        # A form reads only the Arrow types it knows (uuid: also 16-byte binaries;
        # jsonb: also structs and lists); any other type is left to the type
        # check below, which names it.
        if form is None or not (form.applies_to(typ) or form.name == "jsonb" or (
                form.name == "uuid" and pa.types.is_fixed_size_binary(typ))):  # fmt: skip
            continue
        try:
            column = form.of_arrow(table.column(index))
        except FormError as err:
            raise check.error(
                f"does not fit {schema.columns[name].sql_type}: {err.reason} (Arrow row "
                f"{err.index})", name, err.value,
            ) from None  # fmt: skip
        table = table.set_column(index, pa.field(name, column.type), column)
    return table


def validate_arrow(
    check: BatchErrors,
    schema: TableSchema,
    tables: list[pa.Table],
    columns: tuple[str, ...],
    seen: dict[Any, int],
) -> pa.Table:
    """Validate the Arrow upserts; numeric columns come back as exact Arrow decimals.

    Args:
        check: builds the errors.
        schema: the target.
        tables: the staged Arrow tables, concatenated here.
        columns: the upserted columns, in table order.
        seen: the keys of the epoch's dict upserts (a key given twice is refused).

    Raises:
        InvalidInputError: an incompatible type, a NULL key or NOT NULL value, a
            value that does not fit a numeric(p, s) exactly, a duplicate key, or
            a row too large to send.
    """
    try:
        parts = [t.select(list(columns)) for t in tables]
        table = pa.concat_tables(parts, promote_options="default")
    except (pa.ArrowInvalid, pa.ArrowTypeError) as err:
        raise check.error(f"the Arrow tables of this epoch do not share a schema: {err}") from None
    table = _formed(check, schema, table)
    for name in columns:
        col = schema.columns[name]
        typ = table.schema.field(name).type
        if col.kind == "bytes" and not pa.types.is_null(typ):
            raise check.error(
                "bytea columns are not supported in Arrow batches; stage dict rows", name
            )
        if not arrow_type_fits(col, typ):
            raise check.error(f"incompatible type: Arrow {typ} for {col.sql_type}", name, str(typ))
        nulls = table.column(name).null_count
        if nulls and (name in schema.key or col.not_null):
            first = pc.index(pc.is_null(table.column(name)), True).as_py()
            what = "key" if name in schema.key else "NOT NULL"
            raise check.error(f"NULL in {what} column (Arrow row {first})", name, None,
                              sqlstate=NOT_NULL)  # fmt: skip
        if col.kind == "numeric" and not pa.types.is_null(typ):
            # The shared decimal rule (see reconcile/core/decimals.py), vectorized;
            # the exact decimals are what COPY and unnest() then send.
            try:
                exact = check_decimal_array(table.column(name), *col.numeric_bounds)
            except DecimalFitError as err:
                raise check.error(
                    f"does not fit {col.sql_type} exactly: {err.reason}; it is refused "
                    f"rather than rounded (Arrow row {err.index})",
                    name,
                    err.value,
                ) from None
            table = table.set_column(table.schema.get_field_index(name), name, exact)
    _check_row_sizes(check, table)
    keys = list(schema.key)
    # One key column: the fast check; several: the group-by below finds repeats.
    if len(keys) != 1 or not all_distinct(table.column(keys[0])):
        counts = table.select(keys).group_by(keys).aggregate([([], "count_all")])
        dups = counts.filter(pc.greater(counts.column("count_all"), 1))
        if dups.num_rows:
            value = tuple(dups.column(k)[0].as_py() for k in keys)
            raise check.error(
                "duplicate key among the epoch's upserts (Arrow rows)",
                ",".join(keys),
                shown_key(value),
            )
    if seen:
        for row in table.select(keys).to_pylist():
            key = hashable_key(tuple(row[k] for k in keys))
            if key in seen:
                raise check.error(
                    "duplicate key among the epoch's upserts (a dict row and an Arrow row)",
                    ",".join(keys),
                    shown_key(key),
                )
    return table
