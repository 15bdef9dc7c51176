"""Each epoch's outcome is logged at INFO: pipeline, epoch, rows, milliseconds, and the xid."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import psycopg
import pytest

from reconcile import CommitCycle, CommitSucceeded
from sinks.postgres.factory import postgres_sink

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("mode", ["transactional", "prepared"])
def test_an_epoch_is_one_info_line_with_its_xid(
    pg_db: str, mode: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE orders (id int PRIMARY KEY, amount int)")
    cycle = CommitCycle(
        "shop", [postgres_sink(pg_db, "orders", mode=mode, name="orders")], tmp_path
    )
    cycle.start()
    caplog.set_level(logging.INFO)
    rows = [{"id": i, "amount": i} for i in range(5)]
    assert cycle.run_epoch(0, {"orders": rows}) == CommitSucceeded(0)
    cycle.close()
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert any(re.search(r"pipeline shop epoch 0 committed: 5 rows, [\d.]+ ms", m) for m in lines)
    with psycopg.connect(pg_db) as conn:
        row = conn.execute("SELECT xid::text FROM reconcile.reconcile_commits").fetchone()
    assert row is not None
    assert any(f"xid {row[0]}" in m and "shop-orders-0-g1" in m for m in lines), lines
