"""Database health: prepared txns that no sink will end, and marker retention."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from reconcile.cli import main
from reconcile.core.contract import OK, MarkerMismatchError, SinkTxnId
from reconcile.core.progress import EpochStatus
from reconcile.engine.cycle import CommitCycle, CommitSucceeded
from reconcile.engine.faults import Fault, FaultKind, FaultPlan, SimulatedCrash
from reconcile.engine.progress_file import FileProgressLog
from sinks.postgres.factory import postgres_sink

pytestmark = pytest.mark.integration

PIPE = "shop"


def make_tables(dsn: str, *names: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for name in names:
            conn.execute(
                sql.SQL("CREATE TABLE {} (k text PRIMARY KEY, v bigint, _epoch bigint)").format(
                    sql.Identifier(name)
                )
            )


def cycle(dsn: str, state: Path, sinks: list[str], mode: str, **kw: Any) -> CommitCycle:
    built = [postgres_sink(dsn, s, mode=mode, name=s, prepared_warn_after_s=0) for s in sinks]
    return CommitCycle(PIPE, built, FileProgressLog(state, PIPE), **kw)


def outputs(sinks: list[str], epoch: int) -> dict[str, list[dict[str, Any]]]:
    return {s: [{"k": f"e{epoch}", "v": epoch}] for s in sinks}


def crash_at(dsn: str, state: Path, sinks: list[str], epoch: int, point: str, when: str) -> None:
    """Run ``epoch`` and 'die' at ``point``: its prepared txns stay behind."""
    plan = FaultPlan([Fault(point, FaultKind.CRASH, when=when)])  # type: ignore[arg-type]
    c = cycle(dsn, state, sinks, "prepared", faults=plan)
    c.start()
    with pytest.raises(SimulatedCrash):
        c.run_epoch(epoch, outputs(sinks, epoch))


def gids(dsn: str) -> list[str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        query = "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() ORDER BY 1"
        return [r[0] for r in conn.execute(query)]


def epochs(dsn: str, table: str) -> list[int]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        query = sql.SQL("SELECT _epoch FROM {} ORDER BY 1").format(sql.Identifier(table))
        return [r[0] for r in conn.execute(query)]


def pg_cli(capsys: pytest.CaptureFixture[str], *args: str) -> Any:
    assert main(["pg", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_prepared_txns_of_removed_sinks_are_reported_and_settled_by_the_log(
    pg_db: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    make_tables(pg_db, "a", "b", "c")
    state = tmp_path / "state"
    c = cycle(pg_db, state, ["a", "b"], "prepared")
    c.start()
    assert c.run_epoch(0, outputs(["a", "b"], 0)) == CommitSucceeded(0)
    c.close()
    # Epoch 1 dies before its commit point; then sink b is renamed c.
    crash_at(pg_db, state, ["a", "b"], 1, "cycle.commit_progress", "before")
    renamed = cycle(pg_db, state, ["a", "c"], "prepared")
    with caplog.at_level(logging.WARNING):
        renamed.start()  # decides a's txn; b's is not its to decide, but it is reported
    assert "shop-b-1-g2" in caplog.text and "reconcile pg prepared --settle" in caplog.text
    assert renamed.run_epoch(1, outputs(["a", "c"], 1)) == CommitSucceeded(1)
    renamed.close()
    # Epoch 2 dies past its commit point; then sink c is removed.
    crash_at(pg_db, state, ["a", "c"], 2, "cycle.commit_progress", "after")
    alone = cycle(pg_db, state, ["a"], "prepared")
    alone.start()
    assert list(alone.sinks["a"].recover()) == []  # recover() stays the sink's own
    # A txn of the live generation (5) is that writer's to decide.
    live = alone.sinks["a"]
    assert live.stage(SinkTxnId(PIPE, "a", 3, 5), [{"k": "e3", "v": 3}]) == live.prepare(
        SinkTxnId(PIPE, "a", 3, 5)
    )
    assert gids(pg_db) == ["shop-a-3-g5", "shop-b-1-g2", "shop-c-2-g4"]

    args = ["--pg", pg_db, "--state", str(state), "--pipeline", PIPE]
    plan = {r["gid"]: r["action"] for r in pg_cli(capsys, "prepared", *args)}
    assert plan == {"shop-a-3-g5": "leave", "shop-b-1-g2": "abort", "shop-c-2-g4": "commit"}
    assert len(gids(pg_db)) == 3  # listing changes nothing
    pg_cli(capsys, "prepared", *args, "--settle")
    assert gids(pg_db) == ["shop-a-3-g5"]
    # b never got epoch 1 (that attempt never committed); c got epoch 2 exactly once.
    assert epochs(pg_db, "b") == [0] and epochs(pg_db, "c") == [1, 2]
    assert live.abort(SinkTxnId(PIPE, "a", 3, 5)) == OK
    alone.close()


def test_prune_keeps_what_resolution_and_restarts_need(
    pg_db: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    make_tables(pg_db, "a")
    state = tmp_path / "state"
    c = cycle(pg_db, state, ["a"], "transactional")
    c.start()
    for epoch in range(10):
        assert c.run_epoch(epoch, outputs(["a"], epoch)) == CommitSucceeded(epoch)
    c.close()
    with psycopg.connect(pg_db, autocommit=True) as conn:
        # Another state's markers (another sink name) are evidence: never pruned here.
        conn.execute(
            "INSERT INTO reconcile.reconcile_commits (pipeline, sink, epoch, target_schema, "
            "target_table, log_id, xid, backend_pid, generation, row_count) VALUES "
            "(%s, 'z', 1, 'public', 'z', 'other-log', pg_current_xact_id(), 0, 1, 0)",
            (PIPE,),
        )
    args = ["--pg", pg_db, "--state", str(state), "--pipeline", PIPE, "--keep-epochs", "3"]
    assert pg_cli(capsys, "prune", *args) == {
        "schema": "reconcile",
        "log_id": FileProgressLog(state, PIPE).log_id,
        "below_epoch": 7,
        "would_delete": 7,
    }
    assert pg_cli(capsys, "prune", *args, "--apply")["deleted"] == 7
    with psycopg.connect(pg_db, autocommit=True) as conn:
        left = conn.execute(
            "SELECT sink, epoch FROM reconcile.reconcile_commits ORDER BY 1, 2"
        ).fetchall()
        fences = conn.execute("SELECT sink FROM reconcile.reconcile_fences").fetchall()
    assert left == [("a", 7), ("a", 8), ("a", 9), ("z", 1)]
    assert fences == [("a",)]
    # The pipeline goes on: a replay of its newest epoch, then the next epoch.
    again = cycle(pg_db, state, ["a"], "transactional")
    again.start()
    assert again.run_epoch(9, outputs(["a"], 9)) == CommitSucceeded(9, replayed=True)
    assert again.run_epoch(10, outputs(["a"], 10)) == CommitSucceeded(10)
    again.close()
    assert epochs(pg_db, "a") == list(range(11))
    # And a fresh state is still told apart, by the fence row.
    with pytest.raises(MarkerMismatchError):
        cycle(pg_db, tmp_path / "fresh", ["a"], "transactional").start()
    assert FileProgressLog(state, PIPE).status(10) is EpochStatus.FINALIZED
