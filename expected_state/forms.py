"""An epoch's values in their columns' forms, and the columns the store cannot hold.

A sink says, in its ``arrow_schema()``, the form of each column whose type
takes a value in several spellings (``reconcile.core.value_forms``: a uuid's
text, a jsonb's, a ``char(n)``'s padding) and which columns it has of a type
the engine cannot hold exactly. The store puts an epoch's values into their
form before anything else (netting by key included), so that it holds what
the sink gives back, and refuses a refused column before anything is
written, naming the table, the column and the type.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]

from expected_state.column_types import sql_type
from reconcile.core.contract import InvalidInputError
from reconcile.core.value_forms import FormError, ValueForm, refused_columns

__all__ = ["check_refused", "formed", "formed_values"]


def _misfit(
    table: str, name: str, err: FormError, form: ValueForm, types: pa.Schema | None, row: int
) -> InvalidInputError:
    """The error for a value that has no spelling in its column's form (``value_forms``)."""
    sink = sql_type(types, name)
    return InvalidInputError(
        f"table {table!r}: column {name!r} value {err.value!r:.200} (row {row}) does not fit "
        f"the {sink or form.spec} column: {err.reason}; nothing was written",
        table=table,
        column=name,
        value=repr(err.value)[:200],
        sink_type=sink,
    )


def check_refused(names: Iterable[str], types: pa.Schema | None, table: str) -> None:
    """Refuse a column whose sink type the engine cannot hold exactly (the sink says which).

    Raises:
        InvalidInputError: naming the table, the column, its type and why; nothing
            was written.
    """
    refused = refused_columns(types)
    for name in names:
        if name in refused:
            raise InvalidInputError(
                f"table {table!r}: column {name!r} is {refused[name]}; the expected state "
                "cannot hold its values exactly, so it is refused (leave the column out of "
                "the rows, or change its type); nothing was written",
                table=table,
                column=name,
                sink_type=sql_type(types, name),
            )


def formed(data: pa.Table, forms: dict[str, ValueForm], types: pa.Schema | None,
           table: str) -> pa.Table:  # fmt: skip
    """Arrow rows with every column that has a form in that form (``value_forms``).

    Raises:
        InvalidInputError: a value that has no spelling in its column's form,
            naming the table, the column, the value, its row and why.
    """
    for name, form in forms.items():
        index = data.schema.get_field_index(name)
        if index < 0:
            continue
        try:
            column = form.of_arrow(data.column(index))
        except FormError as err:
            raise _misfit(table, name, err, form, types, err.index or 0) from None
        data = data.set_column(index, pa.field(name, column.type), column)
    return data


def formed_values(
    name: str, values: list[Any], form: ValueForm | None, types: pa.Schema | None, table: str
) -> list[Any]:
    """One column's Python values in its form (NULLs stay None); as they are without a form.

    Raises:
        InvalidInputError: as ``formed``.
    """
    if form is None:
        return values
    out = []
    for row, value in enumerate(values):
        try:
            out.append(None if value is None else form.of_python(value))
        except FormError as err:
            raise _misfit(table, name, err, form, types, row) from None
    return out
