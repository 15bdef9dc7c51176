"""The samples the type-table tests write: a column type, values of it, and a value to damage one.

``tests/integration/test_type_table_*.py`` test every row of a sink's type
table on a real server: write the values, verify at 0 drift, change the first
one by hand to ``damage`` (another valid value of the type), verify finds it
once, repair, verify at 0. A refused type is written once and must be refused
up front, naming the table, the column and the type.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pytest

__all__ = ["Refused", "Sample", "type_params"]


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


def type_params(
    table: Iterable[Any], samples: Mapping[str, Sequence[Sample | Refused]], default_tier: set[str]
) -> Iterator[Any]:
    """``(entry, sample)`` parameters for every row of a type ``table`` (entries with a
    ``doc.sql``), one per sample; a row without samples gets ``None``, which its test
    fails on. Samples not named in ``default_tier`` run in the slow tier."""
    for entry in table:
        found: list[Sample | Refused | None] = [*samples.get(entry.doc.sql, [])]
        for sample in found or [None]:
            name = entry.doc.sql if sample is None else sample.ddl
            marks = () if name in default_tier else (pytest.mark.slow,)
            yield pytest.param(entry, sample, id=name.replace(" ", "_"), marks=marks)
