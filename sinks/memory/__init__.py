"""A process-local sink (tests, examples): the two-phase-commit contract held in memory.

The sink is ``sinks.memory.sink.MemorySink``; ``backend`` declares it to ``sinks.registry``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sinks.base import lazy_exports

if TYPE_CHECKING:
    from .sink import CommitRecord, MemorySink, MemoryStore

__all__ = ["CommitRecord", "MemorySink", "MemoryStore"]

__getattr__ = lazy_exports(
    __name__,
    {
        "CommitRecord": "sink",
        "MemorySink": "sink",
        "MemoryStore": "sink",
    },
)
