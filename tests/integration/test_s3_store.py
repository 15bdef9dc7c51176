"""The expected-state store on S3 (moto's server): racing writers, the commit cycle, the CLI.

The store reaches S3 through deltalake (delta-rs) and pyarrow, configured by the
environment alone. delta-rs 1.x creates every Delta log entry with a
conditional put (``If-None-Match: *``): of two writers racing for one table
version exactly one wins, and the other's commit fails and is resolved by the
store (``expected_state.delta_commit``) into FencedError or a retry.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from deltalake import DeltaTable

from expected_state.delta_commit import BEFORE_WRITE
from expected_state.fencing import fence_app_id
from expected_state.store import ExpectedStateStore
from reconcile import CommitCycle, CommitSucceeded
from reconcile.core import hooks
from reconcile.core.contract import Change, FencedError
from reconcile.engine.expected import ExpectedState
from reconcile.testing.matrix import MATRIX, run_row
from sinks.postgres.factory import postgres_sink
from tests.cli_run import cli
from tests.fix_s3 import S3Endpoint
from tests.fix_sinks import MemoryHarness
from tests.integration.test_expected_state import CONCURRENT_WORKER, run_python

pytestmark = pytest.mark.integration

SCHEMA = pa.schema([("k", pa.string()), ("v", pa.int64())])


def store(root: str, generation: int) -> ExpectedStateStore:
    return ExpectedStateStore(root, "pipe", "out", ["k"], schema=SCHEMA, generation=generation)


def as_map(table: pa.Table) -> dict[str, int]:
    return {r["k"]: r["v"] for r in table.to_pylist()}


def test_two_processes_racing_for_every_version_lose_nothing(s3_bucket: str) -> None:
    # Two processes record epochs 1..15 into one table on S3 at the same time:
    # each Delta version has one winner, the loser's commit fails and is made
    # again (or found in), and every epoch is in exactly once.
    root = f"s3://{s3_bucket}/expected"
    procs = [run_python(CONCURRENT_WORKER, root) for _ in range(2)]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err
        results.append(json.loads(out))
    assert sum(r["applied"] for r in results) == 15
    reader = ExpectedStateStore(root, "pipe", "orders", ["k"])
    expected = {f"k{e % 7}": e for e in range(1, 16)} | {f"e{e}": e for e in range(1, 16)}
    assert as_map(reader.snapshot()) == expected
    commits = [c for c in DeltaTable(reader.uri).history() if "reconcile.epoch" in c]
    assert sorted(c["reconcile.epoch"] for c in commits) == list(range(1, 16))


def test_a_zombie_that_lost_the_race_for_a_version_is_fenced(s3_bucket: str) -> None:
    root = f"s3://{s3_bucket}/expected"
    zombie = store(root, 1)
    zombie.claim()
    assert zombie.apply(0, [Change("upsert", {"k": "a", "v": 0})]).applied
    successor = store(root, 2)
    # The takeover commits the version the zombie is about to put: S3 refuses
    # the zombie's log entry (412), delta-rs' conflict check sees the fence
    # token, and the store re-reads the log and finds generation 2.
    with hooks.at(BEFORE_WRITE, successor.claim) as armed, pytest.raises(FencedError):
        zombie.apply(1, [Change("upsert", {"k": "zombie", "v": 1})])
    assert armed.fired == 1
    table = DeltaTable(zombie.uri)
    assert table.transaction_version(fence_app_id("pipe", "out")) == 2
    assert as_map(pa.table(table.to_pyarrow_table())) == {"a": 0}
    assert successor.apply(1, [Change("upsert", {"k": "b", "v": 1})]).applied


ROWS = [r for r in MATRIX if r[0] in {
    "record_expected_state-exception", "record_expected_state-crash",
    "commit-ambiguous-sink-reply-lost", "engine_crash-after-record-progress",
}]  # fmt: skip


@pytest.mark.chaos
@pytest.mark.parametrize(("row", "faults"), ROWS, ids=[r for r, _ in ROWS])
def test_the_commit_cycle_with_the_store_on_s3(
    row: str, faults: Any, s3_bucket: str, tmp_path: Path
) -> None:
    # The failure matrix's rows at and around the store's own step, with the
    # store (and so the progress log, its epochs table) on S3.
    run_row(MemoryHarness(), row, faults, tmp_path / "state", expected_root=f"s3://{s3_bucket}/e")


def test_verify_repair_and_watch_from_a_config_with_the_store_on_s3(
    pg_db: str, s3_endpoint: S3Endpoint, s3_bucket: str, tmp_path: Path
) -> None:
    root = f"s3://{s3_bucket}/expected"
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE lines (id bigint PRIMARY KEY, qty int, _epoch bigint)")
    cycle = CommitCycle(
        "orders",
        [postgres_sink(pg_db, "lines", name="lines")],
        expected_state=ExpectedState(root, "orders", {"lines": ["id"]}),
    )
    cycle.start()
    for epoch in range(4):
        rows = [{"id": epoch * 10 + i, "qty": epoch + i} for i in range(5)]
        assert isinstance(cycle.run_epoch(epoch, {"lines": rows}), CommitSucceeded)
    cycle.close()
    config = tmp_path / "reconcile.toml"
    config.write_text(
        f'[store]\nroot = "{root}"\n\n[pipelines.orders.sinks.lines]\n'
        f'dsn = "{pg_db}"\ntable = "lines"\nkeys = ["id"]\n'
    )
    assert cli("verify", "--config", str(config), "--all").returncode == 0
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("DELETE FROM lines WHERE id IN (1, 31)")
        conn.execute("UPDATE lines SET qty = -1 WHERE id = 32")
    drift = cli("verify", "--config", str(config), "--all", "--json")
    assert drift.returncode == 1, drift.stderr
    found = json.loads(drift.stdout)["tables"][0]
    assert (found["missing"], found["changed"]) == (2, 1)
    watched = cli(
        "watch", "--config", str(config), "--pipeline", "orders", "--every", "1s",
        "--count", "1", "--epochs", "1", "--repair", "--json",
    )  # fmt: skip
    assert json.loads(watched.stdout.splitlines()[0])["tables"][0]["applied"] == 2
    repaired = cli("repair", "--config", str(config), "--all")
    assert repaired.returncode == 1, repaired.stderr  # it found and repaired the rest
    assert cli("verify", "--config", str(config), "--all").returncode == 0
    with psycopg.connect(pg_db) as conn:
        assert conn.execute("SELECT count(*) FROM lines").fetchone() == (20,)
