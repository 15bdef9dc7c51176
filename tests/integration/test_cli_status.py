"""``reconcile status`` is read-only: it creates nothing, repairs nothing, says what is wrong.

It reads both kinds of progress log a pipeline keeps: the file log in a
folder (``--state``) and the expected-state store's ``_epochs`` table
(``--store``; the log of ``CommitCycle(expected_state=...)``), or the one a
config file names (``--config``).
"""

from __future__ import annotations

import json
from pathlib import Path

import psycopg
import pytest

from reconcile.cli import main
from reconcile.core.contract import SinkTxnId
from reconcile.core.progress import EpochStatus
from reconcile.engine.cycle import CommitCycle, CommitSucceeded
from reconcile.engine.expected import ExpectedState
from reconcile.engine.progress_file import FileProgressLog
from sinks.postgres.factory import postgres_sink
from tests.cli_run import cli
from tests.fix_pg import markers_table

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


def store_pipeline(dsn: str, root: Path, epochs: int = 3) -> None:
    """Pipeline ``shop``: ``epochs`` epochs into table ``a`` with the store as its progress log."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE a (k text PRIMARY KEY, v bigint, _epoch bigint)")
    expected = ExpectedState(str(root), "shop", {"orders": ["k"]})
    cycle = CommitCycle("shop", [postgres_sink(dsn, "a", name="orders")], expected_state=expected)
    cycle.start()
    for epoch in range(epochs):
        assert cycle.run_epoch(epoch, {"orders": [{"k": f"e{epoch}", "v": 1}]}) == (
            CommitSucceeded(epoch)
        )
    cycle.close()


def test_status_reads_the_progress_log_kept_in_the_store(pg_db: str, tmp_path: Path) -> None:
    root = tmp_path / "expected"
    store_pipeline(pg_db, root)
    with psycopg.connect(pg_db) as conn:
        table = markers_table(conn)
        assert table is not None
        query = psycopg.sql.SQL("SELECT DISTINCT log_id FROM {}").format(table)
        (marker_log,) = [r[0] for r in conn.execute(query).fetchall()]
    before = listing(tmp_path)
    out = cli("status", "--store", str(root), "--pipeline", "shop", "--json")
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert (got["progress_log"], got["at"], got["pipeline"]) == ("store", str(root), "shop")
    # The same log the sink's markers name: the store's epochs table.
    assert got["log_id"] == marker_log and got["generation"] == 1
    assert got["last_committed"] == 2 and sorted(got["committed"] + got["finalized"]) == [0, 1, 2]
    assert "torn_tail" not in got  # a file log's property only
    with_pg = cli("status", "--store", str(root), "--pipeline", "shop", "--pg", pg_db, "--json")
    assert with_pg.returncode == 0, with_pg.stderr
    (schema,) = json.loads(with_pg.stdout)["postgres"]["schemas"]
    assert [(m["sink"], m["markers"], m["this_log"]) for m in schema["markers"]] == [
        ("orders", 3, True)
    ]
    text = cli("status", "--store", str(root), "--pipeline", "shop")
    assert text.returncode == 0 and "last_committed: 2" in text.stdout
    assert listing(tmp_path) == before  # read-only: not a byte of the store changed


def test_status_of_a_store_that_is_not_there_or_lacks_the_pipeline_creates_nothing(
    pg_db: str, tmp_path: Path
) -> None:
    missing = tmp_path / "nope"
    out = cli("status", "--store", str(missing), "--pipeline", "shop")
    assert out.returncode == 2 and out.stderr.count("\n") == 1
    assert f"no expected-state store at {missing}: the path does not exist" in out.stderr
    assert not missing.exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    out = cli("status", "--store", str(empty), "--pipeline", "shop")
    assert out.returncode == 2 and "(progress logs there: none)" in out.stderr
    assert list(empty.iterdir()) == []  # no _epochs table was created
    root = tmp_path / "expected"
    store_pipeline(pg_db, root, epochs=1)
    before = listing(tmp_path)
    out = cli("status", "--store", str(root), "--pipeline", "shpo", "--json")
    assert out.returncode == 2
    assert "no progress log for pipeline 'shpo'" in out.stderr and "['shop']" in out.stderr
    assert "shpo" in json.loads(out.stdout)["error"]
    assert listing(tmp_path) == before


def test_status_from_a_config_file_reads_the_pipelines_own_log(pg_db: str, tmp_path: Path) -> None:
    store_pipeline(pg_db, tmp_path / "expected", epochs=2)
    make_log(tmp_path / "state", "files")
    config = tmp_path / "reconcile.toml"
    config.write_text(
        f"""
[store]
root = "expected"

[pipelines.shop.sinks.orders]
dsn = "{pg_db}"
table = "a"
keys = ["k"]

[pipelines.files]
progress = "state"

[pipelines.files.sinks.orders]
dsn = "{pg_db}"
table = "b"
keys = ["k"]
"""
    )
    config.chmod(0o600)
    before = listing(tmp_path)
    shop = cli("status", "--config", str(config), "--pipeline", "shop", "--json")
    assert shop.returncode == 0, shop.stderr
    got = json.loads(shop.stdout)
    assert (got["progress_log"], got["last_committed"]) == ("store", 1)
    files = cli("status", "--config", str(config), "--pipeline", "files", "--json")
    assert files.returncode == 0, files.stderr
    got = json.loads(files.stdout)
    assert (got["progress_log"], got["finalized"]) == ("file", [0, 1])
    several = cli("status", "--config", str(config))
    assert several.returncode == 2 and "['shop', 'files']" in several.stderr
    assert listing(tmp_path) == before
