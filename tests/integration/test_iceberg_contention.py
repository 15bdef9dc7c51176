"""The Iceberg sink's commits against a co-writer that commits all the time, on a real catalog.

The co-writer is a thread with a catalog client of its own, appending rows of
its own keys every 50 ms with pyiceberg, as another job writing the same
table would. The engine's prepares and commits lose races to it and are
rebased (``sinks.iceberg.committing``); each test asserts that races were
lost (the fault fired) and reads the table for what went in.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyiceberg.catalog import load_catalog
from pyiceberg.exceptions import CommitFailedException

from reconcile import CommitCycle, CommitSucceeded
from reconcile.core import hooks
from reconcile.core.contract import Retryable, SinkTxnId, WriterIdentity
from sinks.iceberg import committing
from sinks.iceberg.sink import IcebergSink
from sinks.iceberg.tokens import BEFORE_CATALOG_COMMIT
from tests.fix_iceberg import catalog_uri

pytestmark = pytest.mark.integration

SCHEMA = pa.schema([("id", pa.int64()), ("qty", pa.int64())])
CO_WRITER_IDS = 1_000_000


def sink_of(uri: str) -> IcebergSink:
    return IcebergSink("orders", f"{uri}&namespace=shop&key=id", schema=SCHEMA)


def catalog(root: Path) -> Any:
    return load_catalog("harness", type="sql", uri=f"sqlite:///{root}/catalog.db",
                        warehouse=f"file://{root}/warehouse")  # fmt: skip


def co_append(root: Path, n: int) -> None:
    """One append by the co-writer: one row of a key of its own."""
    table = catalog(root).load_table("shop.orders")
    schema = table.schema().as_arrow()
    row = {"id": [CO_WRITER_IDS + n], "qty": [-1], "_epoch": [None]}
    table.append(pa.table({f.name: pa.array(row[f.name], f.type) for f in schema}, schema=schema))


@contextmanager
def co_writer(root: Path, every_s: float = 0.05) -> Iterator[list[int]]:
    """A thread appending every ``every_s`` seconds; yields the list of its appends that landed."""
    landed: list[int] = []
    stop = threading.Event()

    def loop() -> None:
        n = 0
        while not stop.is_set():
            try:
                co_append(root, n)
                landed.append(n)
            except CommitFailedException:
                pass  # the engine's commit came first: try again
            n += 1
            stop.wait(every_s)

    thread = threading.Thread(target=loop, name="iceberg-co-writer", daemon=True)
    thread.start()
    try:
        yield landed
    finally:
        stop.set()
        thread.join(timeout=30)


def rows(epoch: int) -> list[dict[str, Any]]:
    # Each epoch rewrites a key of the epoch before: its commit plans a rewrite.
    return [{"id": i, "qty": epoch} for i in range(epoch, epoch + 20)]


def test_the_engines_commits_land_while_a_co_writer_appends_every_50_ms(tmp_path: Path) -> None:
    uri = catalog_uri(tmp_path)
    cycle = CommitCycle("shop", [sink_of(uri)], tmp_path / "progress", commit_attempts=1)
    cycle.start()
    epochs = 16
    try:
        assert isinstance(cycle.run_epoch(0, {"orders": rows(0)}), CommitSucceeded)
        with (
            hooks.at(BEFORE_CATALOG_COMMIT, lambda: None, times=10**6) as attempts,
            co_writer(tmp_path) as landed,
        ):
            results = [cycle.run_epoch(e, {"orders": rows(e)}) for e in range(1, epochs)]
            during = len(landed)
    finally:
        cycle.close()
    assert all(isinstance(r, CommitSucceeded) for r in results), results
    # The co-writer kept landing, and the engine lost races to it: each epoch
    # lands one prepare and one commit, every other catalog commit it tried lost.
    lost = attempts.hits - 2 * (epochs - 1)
    assert during >= 5 and lost >= 1, (during, lost)
    table = catalog(tmp_path).load_table("shop.orders")
    data = table.scan().to_arrow()
    ours = data.filter(pc.less(data.column("id"), CO_WRITER_IDS)).sort_by("id")
    last = epochs - 1
    assert ours.column("id").to_pylist() == list(range(last + 20))
    assert ours.column("qty").to_pylist() == [min(i, last) for i in range(last + 20)]
    kinds = [s.summary for s in table.snapshots() if s.summary is not None]
    assert [k["reconcile.epoch"] for k in kinds if k.get("reconcile.kind") == "epoch"] == [
        str(e) for e in range(epochs)
    ]  # one snapshot per epoch, none twice
    assert data.num_rows == last + 20 + len(landed)  # nothing of the co-writer's was lost


def test_a_commit_that_loses_every_race_gives_up_naming_the_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    uri = catalog_uri(tmp_path)
    sink = sink_of(uri)
    sink.bind(WriterIdentity("shop", "log"))
    first = SinkTxnId("shop", "orders", 0, 1)
    assert sink.stage(first, rows(0)) and sink.prepare(first) and sink.commit(first)
    txn = SinkTxnId("shop", "orders", 1, 1)
    assert sink.stage(txn, rows(1)) and sink.prepare(txn)
    monkeypatch.setattr(committing, "ATTEMPTS", 4)
    monkeypatch.setattr(committing, "BACKOFF_MAX_S", 0.01)
    appended = iter(range(100))
    # Right before each of the engine's catalog commits, the co-writer commits.
    with hooks.at(BEFORE_CATALOG_COMMIT, lambda: co_append(tmp_path, next(appended)),
                  times=10) as armed:  # fmt: skip
        outcome = sink.commit(txn)
    assert armed.fired == 4
    assert isinstance(outcome, Retryable), outcome
    assert "harness.shop.orders" in outcome.reason and "4 times" in outcome.reason
    table = catalog(tmp_path).load_table("shop.orders")
    assert table.properties["reconcile.shop.orders.epoch"] == "0"  # nothing of epoch 1
    assert table.properties.get("reconcile.shop.orders.prepared.1")  # still prepared
    # Once the co-writer pauses, the same commit goes in.
    assert sink.commit(txn)
    table = catalog(tmp_path).load_table("shop.orders")
    assert table.properties["reconcile.shop.orders.epoch"] == "1"


def test_a_rebase_over_an_append_of_one_of_the_epochs_keys_plans_again(tmp_path: Path) -> None:
    uri = catalog_uri(tmp_path)
    sink = sink_of(uri)
    sink.bind(WriterIdentity("shop", "log"))
    first = SinkTxnId("shop", "orders", 0, 1)
    assert sink.stage(first, rows(0)) and sink.prepare(first) and sink.commit(first)
    txn = SinkTxnId("shop", "orders", 1, 1)
    assert sink.stage(txn, rows(1)) and sink.prepare(txn)

    def co_writer_appends_key_5() -> None:
        # Right before the commit goes to the catalog, a co-writer appends a
        # row of key 5, which this epoch upserts: the plan made before it
        # does not remove that row, so the rebase must plan again.
        table = catalog(tmp_path).load_table("shop.orders")
        schema = table.schema().as_arrow()
        row = {"id": [5], "qty": [-1], "_epoch": [None]}
        table.append(
            pa.table({f.name: pa.array(row[f.name], f.type) for f in schema}, schema=schema)
        )

    with hooks.at(BEFORE_CATALOG_COMMIT, co_writer_appends_key_5) as armed:
        assert sink.commit(txn)
    assert armed.fired == 1
    table = catalog(tmp_path).load_table("shop.orders")
    kinds = [(s.summary or {}).get("reconcile.kind") for s in table.snapshots()]  # type: ignore[union-attr]
    assert kinds[-2:] == [None, "epoch"]  # the co-writer's append landed first: ours was rebased
    data = table.scan().to_arrow()
    fives = data.filter(pc.equal(data.column("id"), 5)).to_pylist()
    assert fives == [{"id": 5, "qty": 1, "_epoch": 1}]  # the epoch's row, and only it
