"""A sink of files on a local disk: each epoch one batch file, committed by an atomic rename.

The sink is ``sinks.files.sink.FileSink``; ``backend`` declares it to ``sinks.registry``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sinks.base import lazy_exports

if TYPE_CHECKING:
    from .sink import FileSink

__all__ = ["FileSink"]

__getattr__ = lazy_exports(
    __name__,
    {
        "FileSink": "sink",
    },
)
