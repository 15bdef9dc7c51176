"""A sink of Delta tables written by Spark's own Delta (delta-spark), for the writer on Spark.

Each epoch is one Delta commit made by a Spark command carrying Delta's own
transaction identifier (``txnAppId`` = ``<pipeline>/<sink>``, ``txnVersion``
= the epoch): an append, or a MERGE by key for upserts and deletes. The sink
is ``sinks.delta_spark.sink.DeltaSparkSink``; ``backend`` declares it to
``sinks.registry`` (``delta+spark:///path``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sinks.base import lazy_exports

if TYPE_CHECKING:
    from .sink import DeltaSparkSink

__all__ = ["DeltaSparkSink"]

__getattr__ = lazy_exports(
    __name__,
    {
        "DeltaSparkSink": "sink",
    },
)
