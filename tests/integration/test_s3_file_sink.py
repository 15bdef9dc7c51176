"""The file sink on S3 (moto's server): conditional puts, atomic visibility, racing writers.

The contract suite and the failure matrix run over this sink too (kind "s3");
these tests take what only an object store has: no rename and no lock, so an
epoch's visibility and the fence rest on ``If-None-Match: *``.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from reconcile.core import hooks
from reconcile.core.contract import (
    OK,
    ConfigurationError,
    FencedError,
    SinkTxnId,
    WriterIdentity,
)
from sinks.registry import open_sink
from sinks.s3.log import APPEND
from sinks.s3.sink import S3FileSink
from tests.fix_s3 import S3Endpoint, S3Harness

pytestmark = pytest.mark.integration

LOG = "log-a"


def writer(harness: S3Harness, name: str = "alpha") -> S3FileSink:
    sink = harness.new_sink(name)
    assert isinstance(sink, S3FileSink)
    sink.bind(WriterIdentity("p", LOG))
    return sink


def prepared(sink: S3FileSink, epoch: int, generation: int, value: int = 0) -> SinkTxnId:
    txn = SinkTxnId("p", sink.name, epoch, generation)
    assert sink.stage(txn, [{"k": f"e{epoch}", "v": value}]) == OK
    assert sink.prepare(txn) == OK
    return txn


def test_the_endpoint_refuses_a_second_create_of_one_key(
    s3_endpoint: S3Endpoint, s3_bucket: str
) -> None:
    # What the commit log stands on: the installed moto answers If-None-Match
    # with 412 for an existing key, as S3 does (it would otherwise overwrite).
    client = s3_endpoint.client()
    client.put_object(Bucket=s3_bucket, Key="k", Body=b"first", IfNoneMatch="*")
    with pytest.raises(Exception) as refused:
        client.put_object(Bucket=s3_bucket, Key="k", Body=b"second", IfNoneMatch="*")
    assert refused.value.response["Error"]["Code"] == "PreconditionFailed"  # type: ignore[attr-defined]
    assert client.get_object(Bucket=s3_bucket, Key="k")["Body"].read() == b"first"


def test_an_epoch_is_invisible_until_its_log_entry_is_put(s3_harness: S3Harness) -> None:
    sink = writer(s3_harness)
    txn = prepared(sink, 0, 1)
    # Prepared: the batch object is there and durable, but no entry names it.
    assert s3_harness.committed("alpha") == {} and s3_harness.prepared("alpha") == [txn]
    seen: list[dict[int, list[Any]]] = []
    with hooks.at(APPEND, lambda: seen.append(s3_harness.committed("alpha"))) as armed:
        assert sink.commit(txn) == OK
    # At the last moment before the entry's PUT, nothing of the epoch is visible;
    # right after it, all of it is.
    assert armed.fired == 1 and seen == [{}]
    assert s3_harness.committed("alpha") == {0: [{"k": "e0", "v": 0}]}
    assert s3_harness.prepared("alpha") == []


def test_a_second_commit_entry_of_an_epoch_changes_nothing_visible(
    s3_harness: S3Harness, s3_endpoint: S3Endpoint
) -> None:  # s3_endpoint: a client for the hand-made entry
    sink = writer(s3_harness)
    assert sink.commit(prepared(sink, 0, 1, value=1)) == OK
    other = prepared(sink, 0, 2, value=2)  # the same epoch, another batch
    # An entry that names the other batch, appended by hand past the end: the
    # writers never append one (their check refuses it), and a reader folding
    # the log keeps the epoch's first entry.
    entry = {"kind": "commit", "pipeline": "p", "sink": "alpha", "epoch": 0, "txn": str(other),
             "rows": 1, "log_id": LOG, "batch": f"batches/{other}.batch"}  # fmt: skip
    end = s3_harness._state("alpha").end
    s3_endpoint.client().put_object(
        Bucket=s3_harness.bucket,
        Key=f"file-sinks/alpha/log/{end + 1:020d}.json",
        Body=json.dumps(entry).encode(),
    )
    assert s3_harness.committed("alpha") == {0: [{"k": "e0", "v": 1}]}
    assert writer(s3_harness).commit(other) == OK  # the epoch is in, by this log


def test_a_zombie_that_lost_the_race_for_the_next_entry_is_fenced(
    s3_harness: S3Harness,
) -> None:
    zombie, successor = writer(s3_harness), writer(s3_harness)
    old = prepared(zombie, 3, 1, value=1)

    def takeover() -> None:
        # Between the zombie's check of the log and its put: generation 2
        # raises the fence and commits the same epoch (it takes the entry the
        # zombie was about to write).
        assert successor.commit(prepared(successor, 3, 2, value=2)) == OK

    with hooks.at(APPEND, takeover) as armed:
        outcome = zombie.commit(old)
    assert armed.fired == 1
    assert not outcome and isinstance(outcome.error, FencedError), outcome
    # Exactly one batch is in for the epoch, the successor's; nothing of the zombie's.
    assert s3_harness.committed("alpha") == {3: [{"k": "e3", "v": 2}]}


def test_two_writers_racing_for_every_entry_lose_nothing(s3_harness: S3Harness) -> None:
    # Two writers of one log commit their own epochs at the same time: each
    # entry of the log has exactly one winner, the loser reads it and appends
    # after it, and every epoch is in once.
    sinks = [writer(s3_harness), writer(s3_harness)]
    txns = [[prepared(sinks[w], e, 1, value=e) for e in range(w, 16, 2)] for w in (0, 1)]
    failures: list[object] = []
    start = threading.Barrier(2)

    def run(w: int) -> None:
        start.wait()
        for txn in txns[w]:
            outcome = sinks[w].commit(txn)
            if outcome != OK:
                failures.append(outcome)

    threads = [threading.Thread(target=run, args=(w,)) for w in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert failures == []
    state = s3_harness._state("alpha")
    commits = sorted(entry.seq for entry in state.committed.values())
    assert len(commits) == 16 and state.end == 16  # one fence entry, sixteen commits
    assert s3_harness.committed("alpha") == {e: [{"k": f"e{e}", "v": e}] for e in range(16)}


def test_the_registry_opens_s3_uris_and_refuses_credentials_in_them(
    s3_endpoint: S3Endpoint, s3_bucket: str
) -> None:
    sink = open_sink("alpha", f"s3://{s3_bucket}/root")
    assert isinstance(sink, S3FileSink) and sink.location.uri() == f"s3://{s3_bucket}/root/alpha"
    with pytest.raises(ConfigurationError) as refused:
        open_sink("alpha", f"s3://AKIAKEY:hunter2@{s3_bucket}/root")
    assert "hunter2" not in str(refused.value)
    assert "credentials and options come from the environment" in str(refused.value)
