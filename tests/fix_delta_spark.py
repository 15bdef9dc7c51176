"""Fixture plugin: the ``delta_spark_harness`` fixture (delta-spark sink tables in a tmp dir).

Its sinks run their commits on the SHARED Spark session (``tests/fix_spark.py``).
Inspection never goes through the sink: rows are read with delta-rs, and the
commits of each epoch are counted from the ``txn`` actions of the table's
``_delta_log`` JSON files.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from reconcile.core.contract import SinkTxnId
from reconcile.testing.harness import ChaosRow
from sinks.delta_spark.sink import DeltaSparkSink


def log_txns(table: Path) -> list[tuple[str, int]]:
    """Every ``txn`` action (app id, version) in the table's log, in commit order."""
    found = []
    for path in sorted((table / "_delta_log").glob("*.json")):
        for line in path.read_text().splitlines():
            action = json.loads(line) if line.strip() else {}
            if "txn" in action:
                found.append((action["txn"]["appId"], int(action["txn"]["version"])))
    return found


def epoch_commits(table: Path, name: str) -> Counter[int]:
    """How many commits recorded each epoch of sink ``name`` (its ``<pipeline>/<name>`` token).

    A claim of a generation restates the epoch token at its current value: it
    is counted out (a claim's commit adds no file), so each count is of the
    commits that wrote the epoch.
    """
    counts: Counter[int] = Counter()
    for path in sorted((table / "_delta_log").glob("*.json")):
        actions = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
        if any("txn" in a and "#" in a["txn"]["appId"] for a in actions):
            continue  # a claim of a generation
        for a in actions:
            if "txn" in a and a["txn"]["appId"].endswith(f"/{name}"):
                counts[int(a["txn"]["version"])] += 1
    return counts


class DeltaSparkHarness:
    """delta-spark sinks (key ``k``) under one directory, on the shared session."""

    kind = "delta_spark"

    def __init__(self, root: Path, spark: Any) -> None:
        self.root = root
        self.spark = spark

    def new_sink(self, name: str) -> DeltaSparkSink:
        return DeltaSparkSink(name, self.root, key=("k",), spark=self.spark)

    def committed(self, name: str) -> dict[int, list[ChaosRow]]:
        # The sink MERGEs by key: a second write of an epoch would replace the
        # first. Every write is still visible: each epoch's rows are repeated
        # once per commit that the log records for it.
        uri = self.root / name
        if not DeltaTable.is_deltatable(str(uri)):
            return {}
        current: dict[int, list[ChaosRow]] = {}
        for row in DeltaTable(str(uri)).to_pyarrow_table().to_pylist():
            current.setdefault(row.pop("_epoch"), []).append(row)
        commits = epoch_commits(uri, name)
        return {epoch: rows * max(commits[epoch], 1) for epoch, rows in current.items()} | {
            epoch: [] for epoch in commits if epoch not in current
        }

    def prepared(self, name: str) -> list[SinkTxnId]:
        # Manifests on disk whose epoch no commit in the log records.
        directory = self.root / name / "_prepared"
        if not directory.exists():
            return []
        done = set(epoch_commits(self.root / name, name))
        txns = [
            SinkTxnId.from_string(json.loads(p.read_text())["txn"])
            for p in directory.glob("*.json")
        ]
        return sorted(t for t in txns if t.epoch not in done)


@pytest.fixture
def delta_spark_harness(tmp_path: Path, spark: Any) -> DeltaSparkHarness:
    """A delta-spark sink harness over a fresh directory, on the shared Spark session."""
    return DeltaSparkHarness(tmp_path / "delta_spark_sinks", spark)
