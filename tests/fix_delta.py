"""Fixture plugin: the ``delta_harness`` fixture (Delta sink tables in a tmp dir)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from reconcile.core.contract import SinkTxnId
from reconcile.testing.harness import ChaosRow
from sinks.delta.sink import DeltaSink


class DeltaHarness:
    """Delta sinks under one directory; inspection reads the Delta log and files directly."""

    kind = "delta"

    def __init__(self, root: Path) -> None:
        self.root = root

    def new_sink(self, name: str) -> DeltaSink:
        return DeltaSink(name, self.root)

    def committed(self, name: str) -> dict[int, list[ChaosRow]]:
        # Independent of the sink client: deltalake reads the table's current version.
        uri = self.root / name
        if not DeltaTable.is_deltatable(str(uri)):
            return {}
        data = pa.table(DeltaTable(str(uri)).to_pyarrow_table())
        found: dict[int, list[ChaosRow]] = {}
        for row in data.to_pylist():
            epoch = row.pop("_epoch")
            found.setdefault(epoch, []).append(row)
        return found

    def prepared(self, name: str) -> list[SinkTxnId]:
        # Manifests on disk whose epoch no Delta commit carries.
        directory = self.root / name / "_prepared"
        if not directory.exists():
            return []
        uri = str(self.root / name)
        history = DeltaTable(uri).history() if DeltaTable.is_deltatable(uri) else []
        done = {c.get("reconcile.txn", "").rsplit("-g", 1)[0] for c in history}
        txns = [
            SinkTxnId.from_string(json.loads(p.read_text())["txn"])
            for p in directory.glob("*.json")
        ]
        return sorted(t for t in txns if f"{t.pipeline}-{t.sink}-{t.epoch}" not in done)


@pytest.fixture
def delta_harness(tmp_path: Path) -> DeltaHarness:
    """A Delta sink harness over a fresh directory."""
    return DeltaHarness(tmp_path / "delta_sinks")
