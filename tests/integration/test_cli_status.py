"""``reconcile status`` is read-only: it creates nothing, repairs nothing, says what is wrong."""

from __future__ import annotations

import json
from pathlib import Path

import psycopg
import pytest

from reconcile.cli import main
from reconcile.contract import SinkTxnId
from reconcile.cycle import CommitCycle, CommitSucceeded
from reconcile.progress import EpochStatus
from reconcile.progress_file import FileProgressLog
from sinks.postgres import postgres_sink

pytestmark = pytest.mark.integration


def listing(root: Path) -> list[tuple[str, bytes]]:
    return sorted(
        (str(p.relative_to(root)), p.read_bytes()) for p in root.rglob("*") if p.is_file()
    )


def make_log(state: Path, pipeline: str = "demo") -> str:
    log = FileProgressLog(state, pipeline)
    generation = log.claim_generation()
    for epoch in (0, 1):
        for status in (EpochStatus.DECIDED, EpochStatus.COMMITTED, EpochStatus.FINALIZED):
            log.mark(epoch, status, generation)
    return log.log_id


def test_a_wrong_state_or_pipeline_creates_nothing_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nope"
    assert main(["status", "--state", str(missing), "--pipeline", "demo"]) == 2
    assert "no progress log folder" in capsys.readouterr().err
    assert not missing.exists()
    state = tmp_path / "state"
    make_log(state)
    before = listing(tmp_path)
    assert main(["status", "--state", str(state), "--pipeline", "dmeo"]) == 2
    err = capsys.readouterr().err
    assert "no progress log for pipeline 'dmeo'" in err and "['demo']" in err
    assert listing(tmp_path) == before


def test_status_shows_generation_and_never_repairs_a_torn_tail(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "state"
    log_id = make_log(state)
    path = state / "demo.progress.jsonl"
    with path.open("ab") as f:
        f.write(b'{"t": "epoch", "epo')  # a crash mid-write
    before = listing(tmp_path)
    assert main(["status", "--state", str(state), "--pipeline", "demo", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["log_id"] == log_id and got["generation"] == 1
    assert got["finalized"] == [0, 1] and got["last_committed"] == 1
    assert got["torn_tail"] is True
    assert listing(tmp_path) == before  # not truncated, nothing created
    assert main(["status", "--state", str(state), "--pipeline", "demo"]) == 0
    assert "torn" in capsys.readouterr().out


def test_status_shows_the_database_side(
    pg_db: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE a (k text PRIMARY KEY, v bigint, _epoch bigint)")
        conn.execute("CREATE TABLE old (k text PRIMARY KEY, v bigint, _epoch bigint)")
    state = tmp_path / "state"
    sink = postgres_sink(pg_db, "a", mode="prepared", name="orders")
    c = CommitCycle("shop", [sink], FileProgressLog(state, "shop"))
    c.start()
    for epoch in range(3):
        assert c.run_epoch(epoch, {"orders": [{"k": f"e{epoch}", "v": 1}]}) == CommitSucceeded(
            epoch
        )
    # A prepared txn of a sink the pipeline no longer declares.
    leftover = postgres_sink(pg_db, "old", mode="prepared", name="old", pipeline="shop")
    txn = SinkTxnId("shop", "old", 3, 1)
    assert leftover.stage(txn, [{"k": "x", "v": 1}]) == leftover.prepare(txn)
    before = listing(tmp_path)
    args = ["status", "--state", str(state), "--pipeline", "shop", "--pg", pg_db, "--json"]
    assert main([*args, "--older-than", "0"]) == 0
    pg = json.loads(capsys.readouterr().out)["postgres"]
    (schema,) = pg["schemas"]
    assert schema["schema"] == "reconcile"
    assert [(m["sink"], m["markers"], m["epochs"], m["this_log"]) for m in schema["markers"]] == [
        ("orders", 3, [0, 2], True)
    ]
    fences = {f["sink"]: (f["generation"], f["this_log"]) for f in schema["fences"]}
    assert fences == {"orders": (1, True), "old": (0, False)}  # 'old' was used unbound
    assert [(p["gid"], p["older_than_threshold"]) for p in pg["prepared"]] == [
        ("shop-old-3-g1", True)
    ]
    assert listing(tmp_path) == before
    assert main(args[:-1]) == 0
    text = capsys.readouterr().out
    assert "sink orders: 3 markers, epochs 0..2" in text and "prepared shop-old-3-g1" in text
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("ROLLBACK PREPARED 'shop-old-3-g1'")


def test_status_of_a_database_without_the_tables_creates_none(
    pg_db: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    make_log(tmp_path / "state")
    args = ["status", "--state", str(tmp_path / "state"), "--pipeline", "demo", "--pg", pg_db]
    assert main([*args, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["postgres"]["schemas"] == []
    with psycopg.connect(pg_db, autocommit=True) as conn:
        assert conn.execute("SELECT to_regnamespace('reconcile')").fetchone() == (None,)
