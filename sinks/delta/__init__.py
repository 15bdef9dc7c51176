"""A sink of Delta tables (delta-rs): each epoch one Delta commit, tokened by its txn id.

The sink is ``sinks.delta.sink.DeltaSink``; ``backend`` declares it to ``sinks.registry``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sinks.base import lazy_exports

if TYPE_CHECKING:
    from .sink import DeltaSink

__all__ = ["DeltaSink"]

__getattr__ = lazy_exports(
    __name__,
    {
        "DeltaSink": "sink",
    },
)
