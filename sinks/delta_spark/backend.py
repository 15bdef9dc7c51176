"""The delta_spark backend, as it declares itself to ``sinks.registry``.

Delta tables on a local disk written through delta-spark on the running
SparkSession: ``delta+spark:///path`` (``?key=k1,k2`` for upserts and deletes
by key, MERGE; without it every epoch is appended). It needs the ``spark``
extra (pyspark and delta-spark's Python API; the session carries the JARs).
"""

from __future__ import annotations

from sinks.base import PULLABLE, Backend

__all__ = ["BACKEND"]

BACKEND = Backend(
    name="delta_spark",
    schemes=("delta+spark",),
    open="sinks.delta_spark.sink:open_uri",
    extra="spark",
    requires=("pyspark", "delta"),
    # Recovery reads and repairs the table with delta-rs (``sinks.delta.recovery``).
    capabilities={PULLABLE: "sinks.delta.factory:pullable_sink"},
)
