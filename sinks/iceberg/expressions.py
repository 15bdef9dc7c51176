"""The few pyiceberg row filters the sink builds, typed once.

pyiceberg's predicates are pydantic models whose constructors mypy reads as
the models' fields; these functions are the one place that says so.
"""

from __future__ import annotations

from typing import Any

from pyiceberg.expressions import (
    BooleanExpression,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    LessThanOrEqual,
)

__all__ = ["above", "at_least", "at_most", "one_of"]


def one_of(column: str, values: set[Any]) -> BooleanExpression:
    """``column IN values``."""
    return In(column, values)  # type: ignore[call-arg, arg-type]


def above(column: str, value: Any) -> BooleanExpression:
    """``column > value``."""
    return GreaterThan(column, value)  # type: ignore[call-arg, arg-type]


def at_least(column: str, value: Any) -> BooleanExpression:
    """``column >= value``."""
    return GreaterThanOrEqual(column, value)  # type: ignore[call-arg, arg-type]


def at_most(column: str, value: Any) -> BooleanExpression:
    """``column <= value``."""
    return LessThanOrEqual(column, value)  # type: ignore[call-arg, arg-type]
