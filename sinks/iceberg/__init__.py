"""An Iceberg sink (pyiceberg): each epoch ONE snapshot, fenced by the catalog's requirements.

The sink is ``sinks.iceberg.sink.IcebergSink``; ``backend`` declares it to ``sinks.registry``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sinks.base import lazy_exports

if TYPE_CHECKING:
    from .location import IcebergLocation
    from .sink import IcebergSink

__all__ = ["IcebergLocation", "IcebergSink"]

__getattr__ = lazy_exports(
    __name__,
    {
        "IcebergLocation": "location",
        "IcebergSink": "sink",
    },
)
