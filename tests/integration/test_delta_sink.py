"""Integration tests of the Delta sink's 2PC operations on real Delta tables in tmp dirs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from reconcile.core.contract import (
    OK,
    Fatal,
    FatalError,
    MarkerMismatchError,
    Retryable,
    SinkTxnId,
    WriterIdentity,
)
from reconcile.testing.harness import rows_for
from sinks.base import TwoPhaseSink
from sinks.delta.sink import DeltaSink
from tests.fix_delta import DeltaHarness

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
    import sinks.delta.sink as delta_module
    from reconcile.core.contract import SinkTxnId
    from sinks.delta.sink import DeltaSink
    from reconcile.testing.harness import rows_for

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


# ---------------------------------------------------------------- manifest paths


def _tamper(sink: DeltaSink, t: SinkTxnId, path: str) -> Path:
    """Point the first file entry of ``t``'s manifest at ``path``; returns the manifest."""
    manifest = sink.directory / "_prepared" / f"{t.pipeline}-{t.sink}-{t.epoch}.json"
    body = json.loads(manifest.read_text())
    body["files"][0]["path"] = path
    manifest.write_text(json.dumps(body))
    return manifest


def test_a_tampered_manifest_entry_is_never_deleted_by_a_re_prepare(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("not the sink's")
    sink = DeltaSink("out", tmp_path / "tables")
    t = prepared_txn(sink, 1)
    _tamper(sink, t, "../../victim.txt")
    assert sink.stage(t, rows_for(1)) == OK
    outcome = sink.prepare(t)  # a re-prepare drops the previous manifest's files
    assert victim.read_text() == "not the sink's"
    assert isinstance(outcome, Fatal) and "'../../victim.txt'" in outcome.reason
    assert "nothing was deleted" in outcome.reason


@pytest.mark.parametrize("kind", ["absolute", "dotdot", "foreign-name", "other-epoch"])
def test_a_tampered_manifest_entry_is_never_committed(tmp_path: Path, kind: str) -> None:
    harness = DeltaHarness(tmp_path / "tables")
    sink = harness.new_sink("out")
    assert sink.commit(prepared_txn(sink, 0)) == OK
    t = prepared_txn(sink, 1)
    real = next((sink.directory / "_txn_files" / "pipe-out-1").glob("*.parquet"))
    outside = tmp_path / "outside.parquet"
    outside.write_bytes(real.read_bytes())
    inside = sink.directory / "_txn_files" / "pipe-out-0"
    paths = {
        "absolute": str(outside),
        "dotdot": "../../outside.parquet",
        "foreign-name": "stolen.parquet",
        "other-epoch": next(p for p in inside.glob("*.parquet")).relative_to(sink.directory),
    }
    (sink.directory / "stolen.parquet").write_bytes(real.read_bytes())
    _tamper(sink, t, str(paths[kind]))
    version = DeltaTable(sink.uri).version()
    outcome = harness.new_sink("out").commit(t)
    assert isinstance(outcome, Fatal) and "not a file this sink wrote" in outcome.reason
    assert DeltaTable(sink.uri).version() == version  # nothing reached the Delta log
    assert harness.committed("out") == {0: rows_for(0)}
    assert outside.exists()


def test_a_symlink_out_of_the_table_root_is_neither_committed_nor_deleted(
    tmp_path: Path,
) -> None:
    harness = DeltaHarness(tmp_path / "tables")
    sink = harness.new_sink("out")
    t = prepared_txn(sink, 1)
    folder = sink.directory / "_txn_files" / "pipe-out-1"
    elsewhere = tmp_path / "elsewhere"
    folder.rename(elsewhere)  # the same names, now outside the root...
    folder.symlink_to(elsewhere, target_is_directory=True)  # ...reached through a link
    restarted = harness.new_sink("out")
    outcome = restarted.commit(t)
    assert isinstance(outcome, Fatal) and "not a file this sink wrote" in outcome.reason
    assert harness.committed("out") == {}
    assert isinstance(restarted.abort(t), Fatal)  # abort deletes by name in that folder
    assert len(list(elsewhere.glob("*.parquet"))) == 1


def test_recover_reports_a_tampered_manifest_instead_of_skipping_it(tmp_path: Path) -> None:
    sink = DeltaSink("out", tmp_path / "tables")
    t = prepared_txn(sink, 1)
    _tamper(sink, t, "/etc/hostname")
    with pytest.raises(FatalError, match="not a file this sink wrote"):
        DeltaSink("out", tmp_path / "tables").recover()


def test_a_manifest_naming_another_epoch_is_refused(tmp_path: Path) -> None:
    sink = DeltaSink("out", tmp_path / "tables")
    t1, t2 = prepared_txn(sink, 1), prepared_txn(sink, 2)
    prepared = sink.directory / "_prepared"
    (prepared / "pipe-out-1.json").write_text((prepared / "pipe-out-2.json").read_text())
    outcome = sink.commit(t1)
    assert isinstance(outcome, Fatal) and "pipe-out-2" in outcome.reason
    assert sink.commit(t2) == OK


def test_abort_of_an_orphan_folder_symlinked_out_of_the_root_deletes_nothing(
    tmp_path: Path,
) -> None:
    # No manifest (a prepare that died before writing it): abort cleans up by
    # name in _txn_files/<key>/, which here is a link to a folder elsewhere.
    sink = DeltaSink("out", tmp_path / "tables")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    victim = elsewhere / f"part-g0-{'0' * 32}.parquet"
    victim.write_bytes(b"someone else's")
    (sink.directory / "_txn_files").mkdir(parents=True)
    (sink.directory / "_txn_files" / "pipe-out-1").symlink_to(elsewhere, target_is_directory=True)
    assert sink.recover() == [txn(1)]  # listed as an orphan, so start() would abort it
    outcome = sink.abort(txn(1))
    assert isinstance(outcome, Fatal) and "symlink" in outcome.reason
    assert victim.read_bytes() == b"someone else's"


def test_an_epoch_whose_commit_left_the_delta_log_is_not_taken_as_written(tmp_path: Path) -> None:
    sink = DeltaSink("out", tmp_path)
    sink.bind(WriterIdentity("pipe", "log-a"))
    t = prepared_txn(sink, 0, generation=1)
    assert sink.commit(t) == OK
    table = DeltaTable(sink.uri)
    table.create_checkpoint()
    for commit in (tmp_path / "out" / "_delta_log").glob("*.json"):
        commit.unlink()  # what log retention does to commits older than a checkpoint
    assert DeltaTable(sink.uri).transaction_version("pipe/out") == 0  # still recorded
    outcome = sink.commit(t)
    assert isinstance(outcome, Fatal) and isinstance(outcome.error, MarkerMismatchError)
    assert "no longer in the Delta log" in outcome.reason
