"""The type table: every column type of a sink's system, and how the engine holds it.

A sink that has a table declares its column types in one registry beside its
mapping code (``sinks.postgres.arrow_types.PG_TYPES``): the same entries say
which Arrow type the expected-state store keeps, which value form
(``reconcile.core.value_forms``) both sides put values in, and
which types are refused. A :class:`ColumnType` is the part of an entry that
the documentation shows; ``sinks.types_doc`` renders the registry into
``docs/types.md``, and a test fails when that page is not what the code says.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["ColumnType", "markdown_rows"]


@dataclass(frozen=True)
class ColumnType:
    """One row of the type table.

    Attributes:
        sql: the column type as the system spells it (``char(n)``).
        store: the Arrow type the expected state keeps it as ("" when refused).
        python: the Python values a row may give for it.
        arrow: the Arrow types an Arrow batch may give for it.
        written: how the sink writes it.
        compared: what is hashed, on both sides (the value form, if any).
        refused: why the engine cannot hold it exactly ("" when it can): a
            row that gives such a column is refused before anything is written.
    """

    sql: str
    store: str = ""
    python: str = ""
    arrow: str = ""
    written: str = ""
    compared: str = ""
    refused: str = ""


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown_rows(types: Sequence[ColumnType]) -> list[str]:
    """The Markdown table of ``types``: the held ones, then the refused ones."""
    lines = [
        "| type | store (Arrow) | Python values | Arrow values | written as | compared as |",
        "|---|---|---|---|---|---|",
    ]
    for t in types:
        if not t.refused:
            cells = (t.sql, t.store, t.python, t.arrow, t.written, t.compared)
            lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    refused = [t for t in types if t.refused]
    if refused:
        lines += ["", "Refused (a row that gives such a column is refused before anything is "
                  "written, naming the table, the column and the type):", "",
                  "| type | why |", "|---|---|"]  # fmt: skip
        lines += [f"| {_cell(t.sql)} | {_cell(t.refused)} |" for t in refused]
    return lines
