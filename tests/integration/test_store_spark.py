"""A store table read from Spark, without delta-spark's JARs, equals the store's own snapshot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from expected_state.spark_state import read_state
from expected_state.store import ExpectedStateStore
from reconcile.core.contract import Change

pytestmark = [pytest.mark.integration]


def test_spark_reads_the_state_of_every_epoch(spark: Any, tmp_path: Path) -> None:
    schema = pa.schema([("k", pa.string()), ("n", pa.int64()), ("v", pa.int64())])
    store = ExpectedStateStore(str(tmp_path), "pipe", "t", ["k", "n"], schema=schema)
    store.apply(1, [Change("upsert", {"k": f"k{i}", "n": i % 2, "v": i}) for i in range(20)])
    store.apply(
        2, [Change("delete", {"k": "k1", "n": 1}), Change("upsert", {"k": "k2", "n": 0, "v": 200})]
    )
    store.compact()  # epoch 1 in the base, epoch 2 a change file
    store.apply(
        3, [Change("upsert", {"k": "k1", "n": 1, "v": 100}), Change("delete", {"k": "k3", "n": 1})]
    )
    for epoch in (1, 2, 3):
        frame = read_state(spark, store.uri, ["k", "n"], version=store.version_of(epoch))
        got = sorted(tuple(r) for r in frame.select("k", "n", "v", "_row_hash", "_epoch").collect())
        expected = store.snapshot(epoch).select(["k", "n", "v", "_row_hash", "_epoch"])
        assert got == sorted(tuple(r.values()) for r in expected.to_pylist()), epoch
