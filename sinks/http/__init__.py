"""A sink that posts each epoch to an HTTP endpoint that speaks the prepare/commit protocol.

The sink is ``sinks.http.sink.HttpSink``; ``backend`` declares it to ``sinks.registry``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sinks.base import lazy_exports

if TYPE_CHECKING:
    from .sink import HttpSink

__all__ = ["HttpSink"]

__getattr__ = lazy_exports(
    __name__,
    {
        "HttpSink": "sink",
    },
)
