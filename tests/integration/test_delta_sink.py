"""Integration tests of the Delta sink's 2PC operations on real Delta tables in tmp dirs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from reconcile.contract import OK, Fatal, Retryable, SinkTxnId
from sinks.base import TwoPhaseSink
from sinks.delta import DeltaSink
from tests.fix_delta import DeltaHarness
from tests.harness import rows_for

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def txn(epoch: int, generation: int = 0) -> SinkTxnId:
    return SinkTxnId("pipe", "out", epoch, generation)


def prepared_txn(sink: DeltaSink, epoch: int, generation: int = 0) -> SinkTxnId:
    t = txn(epoch, generation)
    assert sink.stage(t, rows_for(epoch)) == OK
    assert sink.prepare(t) == OK
    return t


def test_is_a_two_phase_sink(tmp_path: Path) -> None:
    assert isinstance(DeltaSink("out", tmp_path), TwoPhaseSink)


def test_commit_is_one_delta_commit_and_idempotent(tmp_path: Path) -> None:
    harness = DeltaHarness(tmp_path)
    sink = harness.new_sink("out")
    t = prepared_txn(sink, 1)
    assert harness.committed("out") == {}  # prepared is invisible
    assert harness.prepared("out") == [t]
    assert sink.commit(t) == OK
    version = DeltaTable(sink.uri).version()
    assert sink.commit(t) == OK
    assert harness.new_sink("out").commit(t.with_generation(3)) == OK  # keyed without gen
    assert DeltaTable(sink.uri).version() == version
    assert harness.committed("out") == {1: rows_for(1)}
    assert harness.prepared("out") == []
    assert DeltaTable(sink.uri).transaction_version("pipe/out") == 1
    # A replay of the epoch after the commit changes nothing.
    assert sink.stage(t, rows_for(1)) == OK and sink.prepare(t) == OK and sink.commit(t) == OK
    assert harness.committed("out") == {1: rows_for(1)}


def test_abort_deletes_prepared_files_and_is_idempotent(tmp_path: Path) -> None:
    harness = DeltaHarness(tmp_path)
    sink = harness.new_sink("out")
    assert sink.abort(txn(9)) == OK  # unknown txn
    t = prepared_txn(sink, 1)
    assert list((tmp_path / "out" / "_txn_files").rglob("*.parquet"))
    assert sink.abort(t) == OK and sink.abort(t) == OK
    assert not list((tmp_path / "out" / "_txn_files").rglob("*.parquet"))
    assert sink.recover() == [] and harness.prepared("out") == []
    assert isinstance(sink.commit(t), Fatal)  # never prepared any more
    assert harness.committed("out") == {}


def test_abort_of_a_committed_txn_keeps_the_data(tmp_path: Path) -> None:
    harness = DeltaHarness(tmp_path)
    sink = harness.new_sink("out")
    t = prepared_txn(sink, 1)
    assert sink.commit(t) == OK
    assert isinstance(sink.abort(t), Fatal)
    assert harness.committed("out") == {1: rows_for(1)}


def test_recover_lists_prepared_txns_after_a_restart(tmp_path: Path) -> None:
    harness = DeltaHarness(tmp_path)
    sink = harness.new_sink("out")
    t1, t2 = prepared_txn(sink, 1, generation=2), prepared_txn(sink, 2, generation=2)
    assert sink.commit(t1) == OK
    restarted = harness.new_sink("out")
    assert restarted.recover() == [t2]
    assert restarted.recover() == [t2]  # listing changes nothing
    assert restarted.prepare(t2) == OK  # already prepared by the dead process
    assert restarted.commit(t2) == OK
    assert restarted.recover() == []
    assert harness.committed("out") == {1: rows_for(1), 2: rows_for(2)}


def test_prepare_without_staged_rows_is_retryable(tmp_path: Path) -> None:
    sink = DeltaSink("out", tmp_path)
    assert isinstance(sink.prepare(txn(1)), Retryable)


def test_stale_generation_is_fenced(tmp_path: Path) -> None:
    harness = DeltaHarness(tmp_path)
    zombie, current = harness.new_sink("out"), harness.new_sink("out")
    old = prepared_txn(zombie, 2, generation=1)
    assert current.commit(prepared_txn(current, 1, generation=2)) == OK
    outcome = zombie.commit(old)
    assert isinstance(outcome, Fatal) and "fenced" in outcome.reason
    assert harness.committed("out") == {1: rows_for(1)}


def test_schema_mismatch_is_fatal_and_names_the_column(tmp_path: Path) -> None:
    harness = DeltaHarness(tmp_path)
    sink = harness.new_sink("out")
    assert sink.commit(prepared_txn(sink, 1)) == OK
    t = txn(2)
    assert sink.stage(t, [{"k": "x", "v": "not a number"}]) == OK
    outcome = sink.prepare(t)
    assert isinstance(outcome, Fatal) and "v" in outcome.reason
    assert sink.stage(t, [{"k": "x", "v": 1, "extra": 2}]) == OK
    outcome = sink.prepare(t)
    assert isinstance(outcome, Fatal) and "'extra'" in outcome.reason
    assert harness.committed("out") == {1: rows_for(1)}


def test_out_of_order_commit_is_fatal_not_silently_ok(tmp_path: Path) -> None:
    harness = DeltaHarness(tmp_path)
    sink = harness.new_sink("out")
    t1 = prepared_txn(sink, 1)
    assert sink.commit(prepared_txn(sink, 2)) == OK
    outcome = sink.commit(t1)
    assert isinstance(outcome, Fatal) and "reorder" in outcome.reason
    assert harness.committed("out") == {2: rows_for(2)}


CRASH_WORKER = """
    import os, sys, time
    import sinks.delta as delta_module
    from reconcile.contract import SinkTxnId
    from sinks.delta import DeltaSink
    from tests.harness import rows_for

    sink = DeltaSink("out", sys.argv[1])
    txn = SinkTxnId("pipe", "out", 1, 0)
    sink.stage(txn, rows_for(1))
    if sys.argv[2] == "after-prepare":
        sink.prepare(txn)
    else:  # die after the data file is written, before the manifest exists
        def hang(*args, **kwargs):
            print("READY", flush=True)
            time.sleep(600)
        sink._write_manifest = hang
        sink.prepare(txn)
    print("READY", flush=True)
    time.sleep(600)
"""


def kill_worker_at(root: Path, point: str) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(CRASH_WORKER), str(root), point],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    proc.send_signal(signal.SIGKILL)
    _, err = proc.communicate()
    assert line == "READY", err


@pytest.mark.chaos
def test_kill_9_after_prepare_then_recover_and_commit(tmp_path: Path) -> None:
    kill_worker_at(tmp_path, "after-prepare")
    harness = DeltaHarness(tmp_path)
    assert harness.committed("out") == {}
    sink = harness.new_sink("out")
    [t] = sink.recover()
    assert t == txn(1)
    assert sink.commit(t) == OK and sink.commit(t) == OK
    assert harness.committed("out") == {1: rows_for(1)}
    assert sink.recover() == []


@pytest.mark.chaos
def test_kill_9_between_data_file_and_manifest_leaves_nothing_visible(tmp_path: Path) -> None:
    kill_worker_at(tmp_path, "before-manifest")
    harness = DeltaHarness(tmp_path)
    sink = harness.new_sink("out")
    assert harness.committed("out") == {}
    assert isinstance(sink.commit(txn(1)), Fatal)  # not prepared: the manifest never landed
    assert sink.recover() == [txn(1)]  # but its orphan files are reported...
    assert sink.abort(txn(1)) == OK  # ...so that abort cleans them up
    assert sink.recover() == []
    assert not list((tmp_path / "out").rglob("*.parquet"))


def test_table_is_readable_by_plain_deltalake_with_epoch_column(tmp_path: Path) -> None:
    sink = DeltaSink("out", tmp_path)
    for e in (1, 2):
        assert sink.commit(prepared_txn(sink, e)) == OK
    data = pa.table(DeltaTable(str(tmp_path / "out")).to_pyarrow_table())
    assert data.schema.names == ["k", "v", "_epoch"]
    assert sorted(data.column("_epoch").to_pylist()) == [1, 1, 1, 2, 2, 2]
