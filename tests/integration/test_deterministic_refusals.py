"""A refusal that is the same on every attempt stops the pipeline at once, naming what to fix.

Columns ``note`` and ``Note`` are two columns to PostgreSQL and one to a Delta
table: the expected-state store cannot hold both. The engine says so at start,
before a generation is claimed or anything is written, instead of failing at
every store commit (a retry cannot change it).
"""

from __future__ import annotations

import os
from pathlib import Path

import psycopg
import pytest

from reconcile import CommitCycle
from reconcile.core.contract import Change, ConfigurationError
from reconcile.engine.driver import RetryPolicy, drive
from reconcile.engine.expected import ExpectedState
from sinks.memory.sink import MemorySink, MemoryStore
from sinks.postgres.factory import postgres_sink

pytestmark = pytest.mark.integration

FAST = RetryPolicy(give_up_after_s=30.0, initial_s=0.0, max_s=0.0, jitter_s=0.0)


def test_columns_that_differ_only_in_case_stop_at_start(pg_db: str, tmp_path: Path) -> None:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute('CREATE TABLE t (id bigint PRIMARY KEY, note text, "Note" text)')
    builds = []

    def build() -> CommitCycle:
        builds.append(1)
        expected = ExpectedState(str(tmp_path / "store"), "shop", {"t": ["id"]})
        return CommitCycle("shop", [postgres_sink(pg_db, "t", name="t")], expected_state=expected)

    rows = {"t": [{"id": 1, "note": "a", "Note": "b"}]}
    with pytest.raises(ConfigurationError, match=r"columns 'note' and 'Note' differ only in case"):
        drive(build, range(2), lambda e: rows, retry=FAST)
    assert builds == [1]  # neither retried nor restarted
    with psycopg.connect(pg_db, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM t").fetchone() == (0,)
        found = conn.execute("SELECT to_regclass('reconcile.reconcile_commits')").fetchone()
        if found is not None and found[0] is not None:
            markers = conn.execute("SELECT count(*) FROM reconcile.reconcile_commits").fetchone()
            assert markers == (0,)
    assert not (tmp_path / "store" / "shop" / "t").exists()


def test_rows_that_bring_both_spellings_are_refused_at_stage(tmp_path: Path) -> None:
    expected = ExpectedState(str(tmp_path / "store"), "shop", {"out": ["id"]})
    cycle = CommitCycle("shop", [MemorySink("out", MemoryStore())], expected_state=expected)
    cycle.start()
    try:
        result = cycle.run_epoch(0, {"out": [Change("upsert", {"id": 1, "x": 1, "X": 2})]})
    finally:
        cycle.close()
    assert result.error is not None and isinstance(result.error, ConfigurationError)
    assert "columns 'x' and 'X' differ only in case" in str(result.error)
    assert not os.path.exists(tmp_path / "store" / "shop" / "out" / "_delta_log")
