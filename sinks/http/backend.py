"""The http backend, as it declares itself to ``sinks.registry``.

An HTTP endpoint that speaks the prepare/commit protocol (docs/http.md). It
needs nothing beyond the base install.
"""

from __future__ import annotations

from sinks.base import Backend

__all__ = ["BACKEND"]

BACKEND = Backend(name="http", schemes=("http", "https"), open="sinks.http.sink:HttpSink")
