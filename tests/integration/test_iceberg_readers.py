"""An Iceberg sink's table as other readers see it: DuckDB, its Parquet files, the spec.

The table is written through a commit cycle with upserts and deletes (so its
data files were rewritten), then read without the sink: by DuckDB's
``iceberg`` extension (installed from PyPI, loaded from the venv: no download),
by pyarrow from the data files the current snapshot lists, and its metadata
file is checked against the Iceberg table spec (format version 2).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from duckdb_extensions import import_extension

from reconcile import CommitCycle, CommitSucceeded
from reconcile.core.contract import Change
from sinks.iceberg.sink import IcebergSink
from tests.fix_iceberg import catalog_uri, local_path

pytestmark = pytest.mark.integration

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("qty", pa.int32())])


@pytest.fixture
def written(tmp_path: Path) -> IcebergSink:
    """Four epochs: inserts, then upserts of earlier keys and deletes."""
    sink = IcebergSink("items", f"{catalog_uri(tmp_path)}&key=id", schema=SCHEMA)
    cycle = CommitCycle("p", [sink], tmp_path / "progress")
    cycle.start()
    for epoch in range(4):
        changes: list[Any] = [
            Change("upsert", {"id": epoch * 5 + i, "name": f"n{epoch}-{i}", "qty": i})
            for i in range(5)
        ]
        if epoch:
            changes.append(Change("upsert", {"id": epoch - 1, "name": "again", "qty": -epoch}))
            changes.append(Change("delete", {"id": epoch * 5 - 2}))
        assert isinstance(cycle.run_epoch(epoch, {"items": changes}), CommitSucceeded)
    cycle.close()
    return sink


def rows_of(table: pa.Table) -> list[tuple[Any, ...]]:
    return sorted(tuple(r[n] for n in ("id", "name", "qty", "_epoch")) for r in table.to_pylist())


def test_duckdb_reads_the_table(written: IcebergSink) -> None:
    table = written.table()
    assert table is not None
    con = duckdb.connect()
    # The extension comes from the duckdb-extension-iceberg package (and avro, which
    # reads the manifests): a missing one fails here, never skips.
    for extension in ("avro", "iceberg"):
        import_extension(extension, con=con)
    found = con.sql(
        f"SELECT id, name, qty, _epoch FROM iceberg_scan('{table.metadata_location}')"
    ).fetchall()
    assert sorted(found) == rows_of(table.scan().to_arrow())
    assert len(found) == 4 * 5 - 3  # three deletes, the upserts of earlier keys replace


def test_the_data_files_read_with_pyarrow_are_the_table(written: IcebergSink) -> None:
    table = written.table()
    assert table is not None
    files = [task.file.file_path for task in table.scan().plan_files()]
    assert files and all(not task.delete_files for task in table.scan().plan_files())
    data = pa.concat_tables(pq.read_table(local_path(f)) for f in files)
    assert rows_of(data) == rows_of(table.scan().to_arrow())
    # Every file carries Iceberg's field ids, as the spec asks of Parquet data files.
    schema = pq.read_schema(local_path(files[0]))
    assert [f.metadata[b"PARQUET:field_id"] for f in schema] == [b"1", b"2", b"3", b"4"]


def test_the_metadata_file_follows_the_table_spec(written: IcebergSink) -> None:
    table = written.table()
    assert table is not None
    body = json.loads(Path(local_path(table.metadata_location)).read_text())
    # Required fields of table metadata, format version 2 (the spec's "Table Metadata").
    for field in ("format-version", "table-uuid", "location", "last-sequence-number",
                  "last-updated-ms", "last-column-id", "schemas", "current-schema-id",
                  "partition-specs", "default-spec-id", "last-partition-id", "sort-orders",
                  "default-sort-order-id"):  # fmt: skip
        assert field in body, field
    assert body["format-version"] == 2
    schema = next(s for s in body["schemas"] if s["schema-id"] == body["current-schema-id"])
    assert [f["name"] for f in schema["fields"]] == ["id", "name", "qty", "_epoch"]
    assert schema["identifier-field-ids"] == [1]  # the key
    assert max(f["id"] for f in schema["fields"]) <= body["last-column-id"]
    snapshots = {s["snapshot-id"]: s for s in body["snapshots"]}
    main = body["refs"]["main"]
    assert main["type"] == "branch" and main["snapshot-id"] == body["current-snapshot-id"]
    sequence = 0
    chain = []
    snapshot: dict[str, Any] | None = snapshots[main["snapshot-id"]]
    while snapshot is not None:
        for field in ("snapshot-id", "sequence-number", "timestamp-ms", "manifest-list", "summary"):
            assert field in snapshot, field
        assert snapshot["summary"]["operation"] in ("append", "overwrite", "replace", "delete")
        assert Path(local_path(snapshot["manifest-list"])).exists()
        chain.append(snapshot)
        parent = snapshot.get("parent-snapshot-id")
        snapshot = None if parent is None else snapshots[parent]
    chain.reverse()
    for snapshot in chain:  # sequence numbers grow along main's history
        assert snapshot["sequence-number"] > sequence
        sequence = snapshot["sequence-number"]
    assert sequence <= body["last-sequence-number"]
    # One claim (no rows), then one overwrite snapshot per epoch, in order.
    kinds = [(s["summary"]["reconcile.kind"], s["summary"].get("reconcile.epoch")) for s in chain]
    assert kinds == [("claim", "0"), ("epoch", "0"), ("epoch", "1"), ("epoch", "2"), ("epoch", "3")]
    assert {s["summary"]["operation"] for s in chain[1:]} == {"overwrite"}
    log = [entry["snapshot-id"] for entry in body["snapshot-log"]]
    assert log == [s["snapshot-id"] for s in chain]
