"""The samples the type-table tests write: a column type, values of it, and a value to damage one.

``tests/integration/test_type_table_*.py`` test every row of a sink's type
table on a real server: write the values, verify at 0 drift, change the first
one by hand to ``damage`` (another valid value of the type), verify finds it
once, repair, verify at 0. A refused type is written once and must be refused
up front, naming the table, the column and the type.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Refused", "Sample"]


@dataclass(frozen=True)
class Sample:
    """A column type of a row, three values to write, and another value to damage the first."""

    ddl: str
    values: tuple[Any, Any, Any]
    damage: Any


@dataclass(frozen=True)
class Refused:
    """A column type the row refuses, and a value a writer might give for it."""

    ddl: str
    value: Any
