"""The Iceberg part of the sink benchmarks: pyiceberg's SQL catalog and a local warehouse.

The catalog is a SQLite file and the warehouse a folder on this machine's
disk, both in the benchmark's own process (no server); the table
``bench_rows (k string, v long)``, keyed by ``k``, written by ``IcebergSink``
(one snapshot per epoch). Its verify scans the table into Arrow. The figures:
``benchmarks/sink_harness.py``.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from benchmarks.sink_harness import SCHEMA, TABLE, Part, measure

__all__ = ["WRITE_PATH", "run"]

WRITE_PATH = (
    "an epoch is one snapshot: a Parquet data file, a manifest, a manifest list and the "
    "table's metadata file written, then one catalog commit (a row of the SQLite catalog) "
    "that checks the table's uuid and the main branch's snapshot; files whose key bounds "
    "may hold an upserted key are rewritten in the same snapshot; verify scans the table's "
    "Parquet files into Arrow"
)


def run(small_epochs: int, big_rows: int) -> dict[str, Any]:
    """The part's figures, in a catalog and warehouse removed after."""
    from sinks.iceberg.sink import IcebergSink

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        uri = (
            f"iceberg://bench?type=sql&uri=sqlite:///{root}/catalog.db"
            f"&warehouse=file://{root}/warehouse&namespace=bench&key=k"
        )
        (root / "store").mkdir()
        part = Part(
            system="Iceberg (pyiceberg SQL catalog, local warehouse)",
            sink="IcebergSink",
            open=lambda: IcebergSink(TABLE, uri, schema=SCHEMA),
            verify_uri=uri,
        )
        return measure(part, root / "store", small_epochs, big_rows)
