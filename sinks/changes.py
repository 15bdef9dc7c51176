"""An epoch's staged changes netted by key: the last change of each key wins.

Rows arrive as dicts (upserts), ``Change`` values (upserts and deletes) or
Arrow tables (upserts). The keyed sinks that apply an epoch as one set of
upserts and deletes (Iceberg, delta-spark) net them here, alike. Every
failure names the table, the column and the row, and says that nothing was
written.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]

from reconcile.core.contract import Change, InvalidInputError

__all__ = ["net_changes"]


def _rows_of(item: Any, index: int, where: str) -> list[tuple[str, Any]]:
    if isinstance(item, Change):
        return [(item.op, item.row)]
    if isinstance(item, dict):
        return [("upsert", item)]
    if isinstance(item, pa.Table):
        return [("upsert", row) for row in item.to_pylist()]
    raise InvalidInputError(
        f"{where}: item {index} is a {type(item).__name__}, not a dict, a Change or an Arrow "
        "table; nothing was written",
        table=where,
    )


def net_changes(
    items: Sequence[Any], keys: Sequence[str], where: str
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(upserted rows, deleted keys) after netting ``items`` by key: the last change wins.

    Raises:
        InvalidInputError: an item of another kind, a row without a key
            column, or a NULL key (naming the table, the column and the row).
    """
    final: dict[tuple[Any, ...], tuple[str, dict[str, Any]]] = {}
    position = 0
    for index, item in enumerate(items):
        for op, row in _rows_of(item, index, where):
            try:
                key = tuple(row[k] for k in keys)
            except KeyError as exc:
                raise InvalidInputError(
                    f"{where}: row {position} ({op}) has no key column {exc.args[0]!r}; "
                    "nothing was written",
                    table=where,
                    column=str(exc.args[0]),
                ) from None
            for name, value in zip(keys, key, strict=True):
                if value is None:
                    raise InvalidInputError(
                        f"{where}: row {position} ({op}) has a NULL in key column {name!r}; "
                        "nothing was written",
                        table=where,
                        column=name,
                    )
            try:
                final[key] = (op, dict(row))
            except TypeError:
                raise InvalidInputError(
                    f"{where}: row {position} has a key {key!r} that cannot key a row "
                    f"(key columns {list(keys)}); nothing was written",
                    table=where,
                ) from None
            position += 1
    upserts = [row for op, row in final.values() if op == "upsert"]
    deletes = [{k: row[k] for k in keys} for op, row in final.values() if op == "delete"]
    return upserts, deletes
