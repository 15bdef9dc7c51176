"""Fixture plugin: the ``sink_harness`` fixture, parametrized over every sink kind."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reconcile.core.contract import SinkTxnId
from reconcile.testing.harness import ChaosRow, SinkHarness
from sinks.files.sink import FileSink, read_batch
from sinks.http.sink import HttpSink
from sinks.memory.sink import MemorySink, MemoryStore
from tests.http_receiver import ReceiverServer

# Every sink kind with a ``<kind>_harness`` fixture somewhere in the plugins.
# The contract and chaos suites run once per kind listed here.
SINK_KINDS = [
    "memory", "file", "s3", "http", "delta", "iceberg", "postgres", "postgres_prepared", "mariadb",
    "kafka", "delta_spark",
]  # fmt: skip
# The kinds whose prepared txns outlive the process that prepared them.
DURABLE_SINK_KINDS = [k for k in SINK_KINDS if k not in ("postgres", "mariadb", "kafka")]


@pytest.fixture(params=SINK_KINDS)
def sink_harness(request: pytest.FixtureRequest) -> SinkHarness:
    """A harness for each sink kind, built by that kind's own fixture."""
    harness: SinkHarness = request.getfixturevalue(f"{request.param}_harness")
    return harness


@pytest.fixture(params=DURABLE_SINK_KINDS)
def durable_sink_harness(request: pytest.FixtureRequest) -> SinkHarness:
    """A harness for each sink kind with a durable prepare."""
    harness: SinkHarness = request.getfixturevalue(f"{request.param}_harness")
    return harness


class MemoryHarness:
    """Memory sinks over one MemoryStore."""

    kind = "memory"

    def __init__(self) -> None:
        self.store = MemoryStore()

    def new_sink(self, name: str) -> MemorySink:
        return MemorySink(name, self.store)

    def committed(self, name: str) -> dict[int, list[ChaosRow]]:
        # The append-only commit log, not the keyed state: a second commit of an
        # epoch would replace the first in the keyed state and be invisible.
        found: dict[int, list[ChaosRow]] = {}
        for record in self.store.commit_log:
            txn = SinkTxnId.from_string(record.txn)
            if txn.sink == name:
                found.setdefault(txn.epoch, []).extend(record.rows)
        return found

    def prepared(self, name: str) -> list[SinkTxnId]:
        return sorted(txn for txn, _ in self.store.prepared.values() if txn.sink == name)


class FileHarness:
    """File sinks under one directory; inspection reads the batch files."""

    kind = "file"

    def __init__(self, root: Path) -> None:
        self.root = root

    def new_sink(self, name: str) -> FileSink:
        return FileSink(name, self.root)

    def committed(self, name: str) -> dict[int, list[ChaosRow]]:
        found: dict[int, list[ChaosRow]] = {}
        for path in sorted((self.root / name / "committed").glob("*.batch")):
            txn, rows = read_batch(path)
            found.setdefault(txn.epoch, []).extend(rows)
        return found

    def prepared(self, name: str) -> list[SinkTxnId]:
        return sorted(
            SinkTxnId.from_string(p.name.removesuffix(".batch"))
            for p in (self.root / name / "prepared").glob("*.batch")
        )


class HttpHarness:
    """HTTP sinks against one reference receiver; inspection asks the receiver."""

    kind = "http"

    def __init__(self, server: ReceiverServer) -> None:
        self.server = server

    def new_sink(self, name: str) -> HttpSink:
        return HttpSink(name, self.server.url, timeout_s=5.0)

    def _get(self, path: str) -> Any:
        with urllib.request.urlopen(f"{self.server.url}/{path}", timeout=5) as response:
            return json.loads(response.read())

    def committed(self, name: str) -> dict[int, list[ChaosRow]]:
        # Every commit the receiver performed (its append-only log), not its keyed state.
        found: dict[int, list[ChaosRow]] = {}
        for batch in self._get("commit-log"):
            txn = SinkTxnId.from_string(batch["txn"])
            if txn.sink == name:
                found.setdefault(txn.epoch, []).extend(batch["rows"])
        return found

    def prepared(self, name: str) -> list[SinkTxnId]:
        txns = (SinkTxnId.from_string(t) for t in self._get("pending"))
        return sorted(t for t in txns if t.sink == name)


@pytest.fixture
def memory_harness() -> MemoryHarness:
    return MemoryHarness()


@pytest.fixture
def file_harness(tmp_path: Path) -> FileHarness:
    return FileHarness(tmp_path / "file-sinks")


@pytest.fixture
def http_harness() -> Iterator[HttpHarness]:
    with ReceiverServer() as server:
        yield HttpHarness(server)
