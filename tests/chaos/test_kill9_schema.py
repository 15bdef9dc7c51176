"""kill -9 between the store's commit of an epoch that adds a column and the sink's commit.

The failure matrix row "between store commit and sink commit", for a schema
change: the store holds epoch 1 and its new column ``note``; the sink's txn
(its ``ALTER TABLE`` and rows) died with the process. On restart the sink is
told the column it lacks (``take_sink_types``), the epoch reaches it with the
DDL in the same txn, and the table equals the expected state.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from reconcile.recovery import recover
from tests.chaos.schema_pipeline import cycle

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

REPO = Path(__file__).resolve().parents[2]


def test_kill9_between_the_store_schema_commit_and_the_sink_commit_converges(
    pg_db: str, tmp_path: Path
) -> None:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE orders (id bigint PRIMARY KEY, qty integer, _epoch bigint)")
    root = str(tmp_path / "store")
    done = subprocess.run(
        [sys.executable, "-m", "tests.chaos.schema_pipeline", pg_db, root],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    with psycopg.connect(pg_db) as conn:
        columns = [r[0] for r in conn.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'orders'"
        )]  # fmt: skip
        assert "note" not in columns  # the sink's DDL died with its txn
    run = cycle(pg_db, root)
    run.start()
    run.close()
    with psycopg.connect(pg_db) as conn:
        rows = conn.execute("SELECT id, qty, note, _epoch FROM orders ORDER BY id").fetchall()
    assert rows == [(1, 1, None, 0), (2, 20, "two", 1), (3, 3, None, 0), (4, 4, None, 1)]
    report = recover(pg_db, root, "shop", "orders", mode="full", dry_run=True)
    assert (report.missing, report.extra, report.changed) == (0, 0, 0)
