"""Pull-and-diff on the file sink on S3: verify, repair and watch, against moto's S3 server.

Drift is made by hand the way it happens to objects: a batch overwritten, a
commit entry appended by another pipeline sharing the sink. Every assertion
reads the bucket itself (the log's entries, the batches) or a fresh fold.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import boto3
import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
import pytest

from reconcile import Change, CommitCycle, CommitSucceeded
from reconcile.core.contract import FencedError, WriterIdentity
from reconcile.core.target import Repair
from reconcile.engine.expected import ExpectedState
from reconcile.recovery import recover
from sinks.s3.sink import open_uri, pullable_sink
from tests.cli_run import cli
from tests.fix_s3 import S3Endpoint

pytestmark = pytest.mark.integration


def _run(uri: str, store: Path, epochs: list[list[Any]], keys: list[str]) -> None:
    expected = ExpectedState(str(store), "shop", {"orders": keys})
    cycle = CommitCycle("shop", [open_uri("orders", uri)], expected_state=expected)
    cycle.start()
    for epoch, rows in enumerate(epochs):
        assert isinstance(cycle.run_epoch(epoch, {"orders": rows}), CommitSucceeded)
    cycle.close()


def _entries(bucket: str) -> list[dict[str, Any]]:
    s3 = boto3.client("s3")
    listed = s3.list_objects_v2(Bucket=bucket, Prefix="sinks/orders/log/").get("Contents", [])
    return [json.loads(s3.get_object(Bucket=bucket, Key=o["Key"])["Body"].read())
            for o in sorted(listed, key=lambda o: o["Key"])]  # fmt: skip


def _put_entry(bucket: str, entry: dict[str, Any], body: list[dict[str, Any]]) -> None:
    """What a second writer of the sink does: a batch, then the log's next entry."""
    s3 = boto3.client("s3")
    seq = len(_entries(bucket))
    batch = f"batches/hand-{seq}.batch"
    header = json.dumps({"txn": "hand", "epoch": entry["epoch"], "rows": len(body)})
    lines = [header, *(json.dumps(r) for r in body)]
    s3.put_object(Bucket=bucket, Key=f"sinks/orders/{batch}", Body="\n".join(lines).encode())
    s3.put_object(Bucket=bucket, Key=f"sinks/orders/log/{seq:020d}.json",
                  Body=json.dumps({**entry, "batch": batch}).encode())  # fmt: skip


def _rows(n: int, epoch: int) -> list[dict[str, Any]]:
    return [{"id": i, "name": f"n{i}", "qty": i * epoch} for i in range(n)]


@pytest.fixture
def uri(s3_endpoint: S3Endpoint, s3_bucket: str) -> str:
    return f"s3://{s3_bucket}/sinks"


def test_drift_found_exactly_then_repaired_once(uri: str, s3_bucket: str, tmp_path: Path) -> None:
    store = tmp_path / "store"
    # Epoch 2 deletes keys 0 and 1: the fold must remove them.
    epochs = [_rows(10, 1), _rows(10, 2)[5:], [Change("delete", {"id": 0}),
              Change("delete", {"id": 1}), {"id": 20, "name": "x", "qty": 1}]]  # fmt: skip
    _run(uri, store, epochs, ["id"])
    clean = recover(uri, str(store), "shop", "orders", keys=["id"], mode="full", dry_run=True)
    assert (clean.drift, clean.rows_pulled) == (False, 9)
    # Another pipeline writes into the same sink: it re-inserts key 0, changes 7, adds 99.
    _put_entry(s3_bucket, {"kind": "commit", "pipeline": "other", "sink": "orders", "epoch": 0,
                           "txn": "hand", "rows": 3, "log_id": "someone"},
               [{"id": 0, "name": "n0", "qty": 0}, {"id": 7, "name": "hand", "qty": 14},
                {"id": 99, "name": "z", "qty": 0}])  # fmt: skip
    found = recover(uri, str(store), "shop", "orders", keys=["id"], mode="auto", dry_run=True)
    assert (found.mode, found.missing, found.extra, found.changed) == ("full", 0, 2, 1)
    # 3 of 11 rows: past the mass-change brake's default tenth, which is checked too.
    repaired = recover(uri, str(store), "shop", "orders", keys=["id"], mode="full",
                       max_change_fraction=0.5)  # fmt: skip
    assert repaired.applied == 3
    log = _entries(s3_bucket)
    assert [e["kind"] for e in log][-1] == "repair" and log[-1]["log_id"] is not None
    again = recover(uri, str(store), "shop", "orders", keys=["id"], mode="full")
    assert (again.drift, again.applied) == (False, 0)
    assert len(_entries(s3_bucket)) == len(log)  # the second repair wrote nothing


def test_several_key_columns_and_an_empty_sink(uri: str, s3_bucket: str, tmp_path: Path) -> None:
    store = tmp_path / "store"
    rows = [{"a": i % 2, "b": f"k{i}", "v": i} for i in range(6)]
    _run(uri, store, [rows], ["a", "b"])
    # The sink emptied by hand (its one commit's batch overwritten with its header only).
    s3 = boto3.client("s3")
    batch = _entries(s3_bucket)[-1]["batch"]
    key = f"sinks/orders/{batch}"
    header = s3.get_object(Bucket=s3_bucket, Key=key)["Body"].read().split(b"\n")[0]
    s3.put_object(Bucket=s3_bucket, Key=key, Body=header + b"\n")
    found = recover(uri, str(store), "shop", "orders", keys=["a", "b"], mode="full", dry_run=True)
    assert (found.rows_pulled, found.missing, found.extra) == (0, 6, 0)
    recover(uri, str(store), "shop", "orders", keys=["a", "b"], mode="full")
    after = recover(uri, str(store), "shop", "orders", keys=["a", "b"], dry_run=True)
    assert (after.drift, after.rows_pulled) == (False, 6)


def test_a_repair_after_the_log_grew_writes_nothing(
    uri: str, s3_bucket: str, tmp_path: Path
) -> None:
    _run(uri, tmp_path / "store", [_rows(3, 1)], ["id"])
    sink = pullable_sink(uri, "orders", name="orders", key=["id"])
    target = sink.recovery_target("shop", None, write=True)
    schema = pa.schema([("id", pa.int64()), ("name", pa.string()), ("qty", pa.int64())])
    with target.snapshot(schema, ["id"]) as snap:
        seen = snap.newest_epoch
        assert snap.pull_all(None).num_rows == 3
    writer = open_uri("orders", uri)
    writer.bind(WriterIdentity("shop", sink.log.state.committed[("shop", "orders", 0)].log_id))
    from reconcile.core.contract import SinkTxnId

    txn = SinkTxnId("shop", "orders", 1, 1)
    assert writer.stage(txn, _rows(1, 5)) and writer.prepare(txn) and writer.commit(txn)
    before = len(_entries(s3_bucket))
    repair = Repair(pa.table({"id": [50], "name": ["r"], "qty": [1]}, schema=schema),
                    pa.table({"id": pa.array([], pa.int64())}), 1, seen)  # fmt: skip
    assert target.apply(repair) is None
    assert len(_entries(s3_bucket)) == before
    listed = boto3.client("s3").list_objects_v2(Bucket=s3_bucket, Prefix="sinks/orders/repairs/")
    assert listed.get("KeyCount", 0) == 0  # its batch was removed, not left behind


def test_a_stale_generation_repair_is_fenced_and_a_repaired_epoch_replays_as_committed(
    uri: str, s3_bucket: str, tmp_path: Path
) -> None:
    _run(uri, tmp_path / "store", [_rows(3, 1)], ["id"])
    log_id = _entries(s3_bucket)[-1]["log_id"]
    sink = pullable_sink(uri, "orders", name="orders", key=["id"])
    fence = sink.log.refresh().fences.generation("shop").generation
    schema = pa.schema([("id", pa.int64()), ("name", pa.string()), ("qty", pa.int64())])
    upsert = pa.table({"id": [9], "name": ["r"], "qty": [1]}, schema=schema)
    no_keys = pa.table({"id": pa.array([], pa.int64())})
    stale = sink.recovery_target("shop", fence - 1, write=True)
    with stale.snapshot(schema, ["id"]) as snap:
        seen = snap.newest_epoch
    before = len(_entries(s3_bucket))
    with pytest.raises(FencedError):
        stale.apply(Repair(upsert, no_keys, 3, seen))
    assert len(_entries(s3_bucket)) == before
    # The writer's own repair to epoch 3 stands for epochs 1 to 3 ...
    sink.bind(WriterIdentity("shop", log_id))
    own = sink.recovery_target("shop", fence, write=True)
    with own.snapshot(schema, ["id"]) as snap:
        seen = snap.newest_epoch
    assert own.apply(Repair(upsert, no_keys, 3, seen)) == 1
    assert _entries(s3_bucket)[-1]["first_epoch"] == 1
    # ... so a replay of epoch 2 finds it committed and appends nothing.
    from reconcile.core.contract import SinkTxnId

    replay = open_uri("orders", uri)
    replay.bind(WriterIdentity("shop", log_id))
    txn = SinkTxnId("shop", "orders", 2, fence)
    assert replay.stage(txn, _rows(3, 7)) and replay.prepare(txn) and replay.commit(txn)
    assert len(_entries(s3_bucket)) == before + 1


def test_a_dict_row_with_the_reserved_op_column_is_refused(uri: str) -> None:
    from reconcile.core.contract import Fatal, SinkTxnId

    sink = open_uri("orders", uri)
    sink.bind(WriterIdentity("shop", "log"))
    outcome = sink.stage(SinkTxnId("shop", "orders", 0, 1), [{"id": 1, "_op": "delete"}])
    assert isinstance(outcome, Fatal) and "'_op'" in outcome.reason


def test_a_commit_landing_between_the_check_and_the_repairs_put_wins(
    uri: str, s3_bucket: str, tmp_path: Path
) -> None:
    """The log grows after the pre-check, right before the repair entry's put: nothing lands."""
    from reconcile.core import hooks
    from reconcile.core.contract import SinkTxnId
    from sinks.s3.log import APPEND

    _run(uri, tmp_path / "store", [_rows(3, 1)], ["id"])
    log_id = _entries(s3_bucket)[-1]["log_id"]
    sink = pullable_sink(uri, "orders", name="orders", key=["id"])
    target = sink.recovery_target("shop", None, write=True)
    schema = pa.schema([("id", pa.int64()), ("name", pa.string()), ("qty", pa.int64())])
    with target.snapshot(schema, ["id"]) as snap:
        seen = snap.newest_epoch
    writer = open_uri("orders", uri)
    writer.bind(WriterIdentity("shop", log_id))
    txn = SinkTxnId("shop", "orders", 1, 1)
    assert writer.stage(txn, _rows(1, 5)) and writer.prepare(txn)

    def commit_in_between() -> None:
        assert writer.commit(txn)

    repair = Repair(pa.table({"id": [50], "name": ["r"], "qty": [1]}, schema=schema),
                    pa.table({"id": pa.array([], pa.int64())}), 1, seen)  # fmt: skip
    with hooks.at(APPEND, commit_in_between) as armed:
        assert target.apply(repair) is None
    assert armed.fired == 1
    assert [e["kind"] for e in _entries(s3_bucket)][-1] == "commit"  # the epoch's, not ours


@pytest.mark.slow
def test_verify_repair_and_watch_from_the_config_file(
    uri: str, s3_bucket: str, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    _run(uri, store, [_rows(10, 1), _rows(10, 2)], ["id"])
    config = tmp_path / "reconcile.toml"
    config.write_text(
        f'[store]\nroot = "{store}"\n\n[pipelines.shop.sinks.orders]\n'
        f'url = "{uri}"\ntable = "orders"\nkeys = ["id"]\nmax_change_fraction = 0.5\n'
    )
    assert cli("verify", "--config", str(config), "--all").returncode == 0
    _put_entry(s3_bucket, {"kind": "commit", "pipeline": "other", "sink": "orders", "epoch": 0,
                           "txn": "hand", "rows": 1, "log_id": "someone"},
               [{"id": 3, "name": "hand", "qty": 0},
                {"id": 77, "name": "z", "qty": 0}])  # fmt: skip
    drift = cli("verify", "--config", str(config), "--all", "--json")
    assert drift.returncode == 1, drift.stderr
    found = json.loads(drift.stdout)["tables"][0]
    assert (found["extra"], found["changed"]) == (1, 1)
    watched = cli("watch", "--config", str(config), "--pipeline", "shop", "--every", "1s",
                  "--count", "1", "--repair", "--json")  # fmt: skip
    assert json.loads(watched.stdout.splitlines()[0])["tables"][0]["applied"] == 2, watched.stderr
    assert cli("verify", "--config", str(config), "--all").returncode == 0
    assert cli("repair", "--config", str(config), "--all").returncode == 0
