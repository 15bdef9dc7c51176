"""Fixture plugin: the ``iceberg_harness`` fixture (Iceberg tables, a SQLite catalog, a tmp dir).

The catalog is pyiceberg's SQL catalog on a SQLite file, the warehouse a local
folder: every piece of the external system is on disk, so a restarted
process (or a killed one's successor) finds what the first one left.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog import load_catalog
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.manifest import ManifestEntryStatus
from pyiceberg.table import Table

from reconcile.core.contract import SinkTxnId
from reconcile.testing.harness import ChaosRow
from sinks.iceberg.sink import IcebergSink

# The rows of the contract and chaos suites: a text key and an integer value.
HARNESS_SCHEMA = pa.schema([("k", pa.string()), ("v", pa.int64())])


def catalog_uri(root: Path, name: str = "harness") -> str:
    """The ``iceberg://`` URI of a SQL catalog (SQLite) and a warehouse under ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    return (
        f"iceberg://{name}?type=sql&uri=sqlite:///{root}/catalog.db"
        f"&warehouse=file://{root}/warehouse"
    )


def local_path(uri: str) -> str:
    """A ``file://`` location as a path."""
    return uri.removeprefix("file://")


def snapshot_files(table: Table, snapshot_id: int) -> list[str]:
    """The data files snapshot ``snapshot_id`` added (its own ADDED manifest entries)."""
    snapshot = table.snapshot_by_id(snapshot_id)
    assert snapshot is not None
    paths = []
    for manifest in snapshot.manifests(table.io):
        if manifest.added_snapshot_id != snapshot_id:
            continue
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            if entry.status == ManifestEntryStatus.ADDED:
                paths.append(entry.data_file.file_path)
    return paths


class IcebergHarness:
    """Iceberg sinks in one catalog; inspection reads the catalog, the snapshots and the files."""

    kind = "iceberg"

    def __init__(self, root: Path) -> None:
        self.root = root
        self.uri = catalog_uri(root)

    def new_sink(self, name: str) -> IcebergSink:
        return IcebergSink(name, f"{self.uri}&key=k", schema=HARNESS_SCHEMA)

    def table(self, name: str) -> Table | None:
        # A catalog client of its own: nothing of the sink's client is reused.
        catalog = load_catalog(
            "harness", type="sql", uri=f"sqlite:///{self.root}/catalog.db",
            warehouse=f"file://{self.root}/warehouse",
        )  # fmt: skip
        try:
            return catalog.load_table(f"reconcile.{name}")
        except NoSuchTableError:
            return None

    def committed(self, name: str) -> dict[int, list[ChaosRow]]:
        # Every epoch snapshot of main's history, and the rows of ITS epoch in the
        # files it added (a rewrite also adds other epochs' rows again): a second
        # snapshot of one epoch would show its rows twice.
        table = self.table(name)
        found: dict[int, list[ChaosRow]] = {}
        if table is None:
            return found
        snapshot = table.current_snapshot()
        while snapshot is not None:
            summary: Any = snapshot.summary
            if summary.get("reconcile.sink") == name and summary.get("reconcile.kind") == "epoch":
                epoch = int(summary["reconcile.epoch"])
                for path in snapshot_files(table, snapshot.snapshot_id):
                    data = pq.read_table(local_path(path))
                    mine = data.filter(pc.equal(data.column("_epoch"), epoch))
                    rows = found.setdefault(epoch, [])
                    rows.extend(mine.drop_columns(["_epoch"]).to_pylist())
            parent = snapshot.parent_snapshot_id
            snapshot = None if parent is None else table.snapshot_by_id(parent)
        return found

    def prepared(self, name: str) -> list[SinkTxnId]:
        # The prepared records in the table's properties.
        table = self.table(name)
        if table is None:
            return []
        txns = [
            SinkTxnId.from_string(json.loads(value)["txn"])
            for key, value in table.properties.items()
            if key.startswith("reconcile.") and f".{name}.prepared." in key
        ]
        return sorted(txns)


@pytest.fixture
def iceberg_harness(tmp_path: Path) -> IcebergHarness:
    """An Iceberg sink harness over a fresh catalog and warehouse."""
    return IcebergHarness(tmp_path / "iceberg")
