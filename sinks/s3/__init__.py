"""The file sink on S3 object storage: batch objects, made visible by a conditionally-put log entry.

The sink is ``sinks.s3.sink.S3FileSink``; ``backend`` declares it to ``sinks.registry``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sinks.base import lazy_exports

if TYPE_CHECKING:
    from .sink import S3FileSink

__all__ = ["S3FileSink"]

__getattr__ = lazy_exports(
    __name__,
    {
        "S3FileSink": "sink",
    },
)
