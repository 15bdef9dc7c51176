"""A refusal that is the same on every attempt stops the pipeline at once, naming what to fix.

Columns ``note`` and ``Note`` are two columns to PostgreSQL and one to a Delta
table: the expected-state store cannot hold both. The engine says so at start,
before a generation is claimed or anything is written, instead of failing at
every store commit (a retry cannot change it); and at the stage of a later
epoch that brings the second spelling. The same for the store's other
refusals (a type Delta has no type for: delta-rs's own refusal, named) and a
setting the server refuses at every connection. Each used to be retried as if
transient, restarting the cycle and claiming a writer generation each time,
until ``drive`` gave up two minutes later. The tests count the attempts and
read the Postgres table, its markers and the Delta log.
"""

from __future__ import annotations

import datetime as dt
import os
import tempfile
import zoneinfo
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError
from psycopg import sql

from expected_state.delta_commit import DeltaCommit, commit_files
from expected_state.refusals import store_refusal
from reconcile import CommitCycle
from reconcile.core.contract import Change, ConfigurationError
from reconcile.engine.driver import RetryPolicy, drive
from reconcile.engine.expected import ExpectedState
from sinks.memory.sink import MemorySink, MemoryStore
from sinks.postgres.factory import postgres_sink
from tests.fix_pg import markers_table

pytestmark = pytest.mark.integration

FAST = RetryPolicy(give_up_after_s=30.0, initial_s=0.0, max_s=0.0, jitter_s=0.0)
# Generous enough that a refusal taken for transient would be retried several
# times (and counted) before the driver gave up.
PATIENT = RetryPolicy(give_up_after_s=8.0, initial_s=0.05, max_s=0.2, jitter_s=0.0)


class Attempts:
    """``drive``'s outputs, counting how often an epoch was run."""

    def __init__(self, *batches: Any) -> None:
        self.batches, self.runs = batches, [0] * len(batches)

    def __call__(self, epoch: int) -> dict[str, Any]:
        self.runs[epoch] += 1
        return {"t": self.batches[epoch]}


def _pg_cycle(dsn: str, root: str) -> CommitCycle:
    return CommitCycle(
        "shop",
        [postgres_sink(dsn, "t", name="t")],
        expected_state=ExpectedState(root, "shop", {"t": ["id"]}),
    )


def _sink_state(dsn: str) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """The table's rows and the markers' epochs, as Postgres holds them."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT id FROM t ORDER BY id").fetchall()
        table = markers_table(conn)
        epochs = (
            []
            if table is None
            else conn.execute(
                sql.SQL("SELECT epoch FROM {} ORDER BY epoch").format(table)
            ).fetchall()
        )
    return rows, epochs


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


def test_a_later_epoch_that_brings_the_other_spelling_stops_with_the_store_unchanged(
    tmp_path: Path,
) -> None:
    root = str(tmp_path / "store")
    memory = MemoryStore()
    outputs = Attempts([{"id": 1, "note": "a"}], [{"id": 2, "note": "c", "Note": "d"}])

    def build() -> CommitCycle:
        return CommitCycle("shop", [MemorySink("t", memory)],
                           expected_state=ExpectedState(root, "shop", {"t": ["id"]}))  # fmt: skip

    with pytest.raises(ConfigurationError) as stopped:
        drive(build, [0, 1], outputs, retry=PATIENT)
    assert outputs.runs == [1, 1]  # epoch 1 not retried
    assert "columns 'note' and 'Note' differ only in case" in str(stopped.value)
    assert "epoch 1" in str(stopped.value) and "\n" not in str(stopped.value)
    table = DeltaTable(f"{root}/shop/t")
    assert [f.name for f in table.schema().fields if not f.name.startswith("_")] == ["id", "note"]
    committed = [h.get("reconcile.epoch") for h in table.history()]
    assert 1 not in committed and 0 in committed
    assert sorted(e for (_, _, e) in memory.committed) == [0]


def test_a_type_the_store_cannot_take_stops_at_once_naming_the_store_table(
    tmp_path: Path,
) -> None:
    """A timestamp in a zone other than UTC: Delta has no type for it (delta-rs refuses it)."""
    root = str(tmp_path / "store")
    tokyo = dt.datetime(2020, 1, 1, 9, tzinfo=zoneinfo.ZoneInfo("Asia/Tokyo"))
    outputs = Attempts([{"id": 1, "at": tokyo}])
    memory = MemoryStore()

    def build() -> CommitCycle:
        return CommitCycle("shop", [MemorySink("t", memory)],
                           expected_state=ExpectedState(root, "shop", {"t": ["id"]}))  # fmt: skip

    with pytest.raises(ConfigurationError) as stopped:
        drive(build, [0], outputs, retry=PATIENT)
    message = str(stopped.value)
    assert outputs.runs == [1]
    assert f"expected-state store table '{root}/shop/t' refuses" in message
    assert "Invalid data type for Delta Lake" in message and "Asia/Tokyo" in message
    assert "\n" not in message and "<unknown>" not in message  # no native backtrace
    assert memory.committed == {} and memory.prepared == {}
    assert not (tmp_path / "store" / "shop" / "t" / "_delta_log").exists()


def test_a_commit_delta_rs_refuses_is_terminal_and_leaves_the_log_as_it_was() -> None:
    """The store's commit itself: delta-rs's refusal (a plain Exception) named, not retried."""
    uri = tempfile.mkdtemp()
    DeltaTable.create(uri, pa.schema([("id", pa.int64())]))
    bad = pa.schema([("id", pa.int64()), ("at", pa.timestamp("s"))])
    with pytest.raises(ConfigurationError) as refused:
        commit_files(DeltaCommit(table_uri=uri, schema=bad, app_id="shop/t", version=0))
    assert f"store table {uri!r} refuses the commit of token 0" in str(refused.value)
    assert "Timestamp(s)" in str(refused.value) and "\n" not in str(refused.value)
    assert DeltaTable(uri).version() == 0  # nothing was committed
    # A lost race and an I/O error are not refusals: they stay retryable.
    assert store_refusal(CommitFailedError("conflict"), table=uri, what="x") is None
    assert store_refusal(OSError("No space left on device"), table=uri, what="x") is None


def test_a_setting_the_server_refuses_at_every_connection_stops_at_once(
    pg_db: str, tmp_path: Path
) -> None:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id bigint PRIMARY KEY, _epoch bigint)")
    dsn = f"{pg_db} options='-c statement_timeout=soon'"
    builds: list[int] = []

    def build() -> CommitCycle:
        builds.append(1)
        return _pg_cycle(dsn, str(tmp_path / "store"))

    with pytest.raises(ConfigurationError) as stopped:
        drive(build, [0], Attempts([{"id": 1}]), retry=PATIENT)
    message = str(stopped.value)
    assert builds == [1]
    assert 'invalid value for parameter "statement_timeout"' in message
    assert "retrying cannot help" in message and "\n" not in message
    assert _sink_state(pg_db) == ([], [])
