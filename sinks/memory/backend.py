"""The memory backend, as it declares itself to ``sinks.registry``.

A process-local sink (tests, examples): sinks of one ``memory://NAME`` share a
store. It needs nothing beyond the base install.
"""

from __future__ import annotations

from sinks.base import Backend

__all__ = ["BACKEND"]

BACKEND = Backend(name="memory", schemes=("memory",), open="sinks.memory.sink:open_uri")
