"""Rows of the Delta sink: turning staged dicts into an Arrow batch that fits the table."""

from __future__ import annotations

from typing import Any

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
from deltalake import DeltaTable

from reconcile.core.contract import RowsRejectedError

__all__ = ["EPOCH_COLUMN", "data_schema_is_empty", "rows_to_arrow", "state_schema"]

EPOCH_COLUMN = "_epoch"


def state_schema(table: DeltaTable | None) -> pa.Schema | None:
    """The table's Arrow schema (``_epoch`` included), or None before it exists."""
    if table is None:
        return None
    return pa.schema(table.schema().to_arrow())


def rows_to_arrow(
    rows: list[Any],
    epoch: int,
    *,
    stored: pa.Schema | None,
    declared: pa.Schema | None,
    uri: str,
) -> pa.Table:
    """The rows plus ``_epoch`` in the table's schema (or the declared one, or inferred).

    Raises:
        RowsRejectedError: a column the table lacks, or a value that does not fit;
            it names the table, and nothing was written.
    """
    schema = stored if stored is not None and len(stored) > 1 else None
    if schema is None and declared is not None:
        schema = declared.append(pa.field(EPOCH_COLUMN, pa.int64()))
    with_epoch = [{**row, EPOCH_COLUMN: epoch} for row in rows]
    try:
        if schema is not None:
            extra = sorted({k for r in with_epoch for k in r} - set(schema.names))
            if extra:
                raise RowsRejectedError(
                    f"column {extra[0]!r} is not in the table {uri!r} "
                    f"(columns: {schema.names}); nothing was written",
                    table=uri,
                    column=extra[0],
                    epoch=epoch,
                )
            return pa.Table.from_pylist(with_epoch, schema=schema)
        data = pa.Table.from_pylist(with_epoch)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise RowsRejectedError(
            f"rows do not fit the table {uri!r}: {exc}; nothing was written", table=uri, epoch=epoch
        ) from exc
    return data


def data_schema_is_empty(schema: pa.Schema) -> bool:
    """True if ``schema`` holds no column but ``_epoch`` (an empty batch's inferred schema)."""
    return [n for n in schema.names if n != EPOCH_COLUMN] == []
