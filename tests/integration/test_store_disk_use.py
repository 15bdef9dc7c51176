"""``reconcile status`` shows the store's disk use, and the store's retention is configurable.

The figures are checked against the table's folder as ``os.walk`` lists it, each
file classified here, on its own, from the Delta log's JSON commits and its
checkpoint: the test never calls the code it checks to classify a file.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from expected_state.progress_log import StoreProgressLog
from expected_state.store import ExpectedStateStore
from reconcile import CommitCycle, CommitSucceeded, EpochStatus
from reconcile.cli import main
from reconcile.engine.expected import ExpectedState
from sinks.memory import MemorySink, MemoryStore
from tests.fix_s3 import S3Endpoint

pytestmark = pytest.mark.integration

SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.int64())])
ONE_EPOCH = re.compile(r"^change-e\d{12}-[0-9a-f]{32}\.parquet$")


def on_disk(table: Path) -> dict[str, int]:
    """Every file under the table's folder (relative path -> size), as os.walk lists it."""
    found = {}
    for folder, _, names in os.walk(table):
        for name in names:
            path = Path(folder) / name
            found[str(path.relative_to(table))] = path.stat().st_size
    return found


def expected_figures(table: Path) -> dict[str, int]:
    """The five figures, from the log's files read here: its oldest commit on, replayed."""
    log = table / "_delta_log"
    commits = sorted(int(p.name[:20]) for p in log.glob("*.json"))
    oldest = commits[0]
    live: set[str] = set()
    checkpoint = log / f"{oldest:020d}.checkpoint.parquet"
    if checkpoint.exists():
        adds = pq.read_table(checkpoint, columns=["add"]).column("add").to_pylist()
        live = {a["path"] for a in adds if a is not None}
        replay = [v for v in commits if v > oldest]
    else:
        assert oldest == 0, "a log pruned without a checkpoint at its start"
        replay = commits
    referenced = set(live)
    for version in replay:
        for line in (log / f"{version:020d}.json").read_text().splitlines():
            action = json.loads(line)
            if "add" in action:
                live.add(action["add"]["path"])
                referenced.add(action["add"]["path"])
            if "remove" in action:
                live.discard(action["remove"]["path"])
    figures = dict.fromkeys(("live", "change", "history", "retained", "log"), 0)
    for path, size in on_disk(table).items():
        if path.startswith("_delta_log"):
            figures["log"] += size
        elif path in live:
            figures["change" if ONE_EPOCH.match(path) else "live"] += size
        elif path in referenced:
            figures["history"] += size
        else:
            figures["retained"] += size
    figures["total"] = sum(on_disk(table).values())
    return figures


def status_disk(root: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    assert main(["status", "--store", str(root), "--pipeline", "shop", "--json"]) == 0
    disk: dict[str, object] = json.loads(capsys.readouterr().out)["disk"]
    return disk


def listing(root: Path) -> list[tuple[str, bytes]]:
    return sorted(
        (str(p.relative_to(root)), p.read_bytes()) for p in root.rglob("*") if p.is_file()
    )


def test_status_splits_the_store_on_disk_as_its_log_and_folder_say(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "expected"
    store = ExpectedStateStore(str(root), "shop", "orders", ["k"], schema=SCHEMA)
    progress = StoreProgressLog(str(root), "shop")
    generation = progress.claim_generation()
    state: dict[int, int] = {}
    states: dict[int, dict[int, int]] = {}

    def epoch(e: int) -> None:
        rows = {k: e * 100 + k for k in range(e % 3, 40, 3)}
        gone = [k for k in list(state) if k % 7 == e % 7 and k not in rows]
        ops = ["upsert"] * len(rows) + ["delete"] * len(gone)
        values = [*rows.values(), *(0 for _ in gone)]
        store.apply(e, pa.table({"k": [*rows, *gone], "v": values, "_op": ops}))
        for k in gone:
            state.pop(k, None)
        state.update(rows)
        states[e] = dict(state)
        progress.mark_many([(e, EpochStatus.DECIDED), (e, EpochStatus.COMMITTED)], generation)

    for e in range(6):
        epoch(e)
    store.compact_changes()
    store.compact()  # a base through epoch 4; epoch 5 keeps its file
    store.checkpoint()
    for e in range(6, 9):
        epoch(e)
    store.compact_changes()  # epochs 5..7 merged; 8 keeps its file
    epoch(9)
    # An epoch's file written ahead and never committed (a writer that died).
    orphan = store.write_ahead(
        10, store.normalize(pa.table({"k": [1], "v": [1], "_op": ["upsert"]}))
    )
    assert orphan is not None and orphan.files
    # Keeps epochs 8 and 9 and prunes the log to the checkpoint: what compact()
    # removed is then referenced by no version in the log; retention keeps it.
    store.vacuum(keep_epochs=2, retention_hours=24)
    table = root / "shop" / "orders"
    want = expected_figures(table)
    assert all(want[k] > 0 for k in ("live", "change", "history", "retained", "log")), want
    before = listing(tmp_path)
    disk = status_disk(root, capsys)
    assert listing(tmp_path) == before  # read-only: not a byte of the store changed
    tables = disk["tables"]
    assert isinstance(tables, dict)
    got = tables["orders"]
    assert {k: got[k] for k in want} == want
    assert got["files"] == len([p for p in on_disk(table) if not p.startswith("_delta_log")])
    assert disk["total"] == got  # the pipeline's one table
    epochs_table = disk["epochs_table"]
    assert isinstance(epochs_table, dict)
    assert epochs_table["total"] == sum(on_disk(root / "_epochs").values())
    assert main(["status", "--store", str(root), "--pipeline", "shop"]) == 0
    text = capsys.readouterr().out
    assert f"  orders: {want['total'] / 1e6:,.1f} MB (live {want['live'] / 1e6:,.1f} MB" in text

    # Retention 0: whatever no kept version references goes, and the rows stay whole.
    store.vacuum(keep_epochs=2, retention_hours=0, safety_margin_minutes=0)
    after = status_disk(root, capsys)["tables"]
    assert isinstance(after, dict)
    want = expected_figures(table)
    assert after["orders"]["retained"] == want["retained"] == 0
    assert {k: after["orders"][k] for k in want} == want
    assert after["orders"]["history"] > 0  # epoch 8's version still reads epochs 5..7's files
    # Kept by epoch, whatever the retention: the state as of epoch 8 reads back too.
    for at in (None, 8):
        snapshot = store.snapshot(at)
        rows = dict(zip(*(snapshot.column(c).to_pylist() for c in ("k", "v")), strict=True))
        assert rows == states[9 if at is None else at]


def test_the_commit_cycle_vacuums_with_the_pipelines_retention(tmp_path: Path) -> None:
    root = tmp_path / "expected"
    expected = ExpectedState(
        str(root), "shop", {"orders": ["k"]}, retention_hours=1, safety_margin_minutes=0
    )
    cycle = CommitCycle("shop", [MemorySink("orders", MemoryStore())], expected_state=expected)
    cycle.start()
    state: dict[int, int] = {}
    for e in range(52):
        rows = {"orders": [{"k": e % 5, "v": e}]}
        assert cycle.run_epoch(e, rows) == CommitSucceeded(e)
        state[e % 5] = e
        if e == 0:
            # Writers that died after writing an epoch's file ahead leave it behind:
            # no version references it, and only retention keeps it. One of them
            # two hours ago, one just now.
            other = ExpectedStateStore(str(root), "shop", "orders", ["k"])
            ahead = other.normalize(pa.table({"k": [9], "v": [9], "_op": ["upsert"]}))
            written = [other.write_ahead(1_000 + i, ahead) for i in range(2)]
            orphan, fresh = (f.path for w in written if w is not None for f in w.files)
            assert {orphan, fresh} <= set(on_disk(root / "shop" / "orders"))
            then = time.time() - 2 * 3600
            os.utime(root / "shop" / "orders" / orphan, (then, then))
    # The housekeeping after the 51st epoch merged 50 epochs' files and vacuumed, with
    # the pipeline's retention of 1 hour (the default, 0, would take the fresh one too).
    cycle.close()
    table = root / "shop" / "orders"
    assert orphan not in on_disk(table)
    assert expected_figures(table)["retained"] == on_disk(table)[fresh]
    snapshot = ExpectedStateStore(str(root), "shop", "orders", ["k"]).snapshot()
    assert dict(zip(*(snapshot.column(c).to_pylist() for c in ("k", "v")), strict=True)) == state


def test_status_shows_the_disk_use_of_a_store_on_s3(
    s3_endpoint: S3Endpoint, s3_bucket: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = f"s3://{s3_bucket}/expected"
    store = ExpectedStateStore(root, "shop", "orders", ["k"], schema=SCHEMA)
    progress = StoreProgressLog(root, "shop")
    generation = progress.claim_generation()
    for e in range(4):
        store.apply(e, pa.table({"k": [e, 10 + e], "v": [e, e], "_op": ["upsert"] * 2}))
        progress.mark_many([(e, EpochStatus.DECIDED), (e, EpochStatus.COMMITTED)], generation)
    store.compact_changes()
    ahead = store.normalize(pa.table({"k": [1], "v": [1], "_op": ["upsert"]}))
    assert store.write_ahead(4, ahead) is not None  # never committed: retained
    # The bucket's objects copied to a folder, classified there as for a local store.
    client = s3_endpoint.client()
    prefix = "expected/shop/orders/"
    copy = tmp_path / "copy"
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=s3_bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            if item["Key"].endswith("/"):
                assert item["Size"] == 0  # a folder's marker, no file
                continue
            target = copy / item["Key"].removeprefix(prefix)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(client.get_object(Bucket=s3_bucket, Key=item["Key"])["Body"].read())
    want = expected_figures(copy)
    assert want["history"] > 0 and want["retained"] > 0 and want["live"] > 0, want

    def objects() -> list[tuple[str, str]]:
        listed = client.list_objects_v2(Bucket=s3_bucket).get("Contents", [])
        return sorted((o["Key"], o["ETag"]) for o in listed)

    before = objects()
    assert main(["status", "--store", root, "--pipeline", "shop", "--json"]) == 0
    assert objects() == before  # read-only on S3 too
    got = json.loads(capsys.readouterr().out)["disk"]["tables"]["orders"]
    assert {k: got[k] for k in want} == want


def test_a_store_table_that_cannot_be_read_leaves_the_rest_of_status_shown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "expected"
    progress = StoreProgressLog(str(root), "shop")
    progress.claim_generation()
    log = root / "shop" / "orders" / "_delta_log"
    log.mkdir(parents=True)
    (log / f"{0:020d}.json").write_text("not a Delta commit\n")
    before = listing(tmp_path)
    assert main(["status", "--store", str(root), "--pipeline", "shop", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["generation"] == 1
    assert got["disk"]["error"].startswith("not shown: the store's log or files cannot be read")
    assert listing(tmp_path) == before
