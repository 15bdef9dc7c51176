"""The Iceberg backend, as it declares itself to ``sinks.registry``.

Iceberg tables in any catalog pyiceberg supports (SQL, REST, Glue, Hive, ...):
``iceberg://CATALOG?type=sql&uri=...&warehouse=...``. Its sinks write one
snapshot per epoch; recovery pulls a snapshot into Arrow. It needs the
``iceberg`` extra (pyiceberg with its Arrow I/O and SQL catalog).
"""

from __future__ import annotations

from sinks.base import PULLABLE, Backend

__all__ = ["BACKEND"]

BACKEND = Backend(
    name="iceberg",
    schemes=("iceberg",),
    open="sinks.iceberg.factory:open_uri",
    extra="iceberg",
    requires=("pyiceberg", "pyiceberg.io.pyarrow"),
    capabilities={PULLABLE: "sinks.iceberg.factory:pullable_sink"},
)
