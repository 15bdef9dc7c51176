"""No silent skip: a sink answers "already committed" only for its own progress log's commits.

A fresh or wiped state folder (a new progress log) meeting a sink that already
holds epochs of the same pipeline and sink names must either write every row
or stop with an error that says what it found; it must never report success
for an epoch it did not write. Checked through CommitCycle + FileProgressLog
against the external state of each reference sink (memory, file, HTTP, Delta).
"""

from __future__ import annotations

import json
import shutil
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from reconcile.core.contract import (
    ConfigurationError,
    Fatal,
    MarkerMismatchError,
    Ok,
    SinkTxnId,
    WriterIdentity,
)
from reconcile.engine.cycle import CommitCycle, CommitFatal, CommitResult, CommitSucceeded
from reconcile.engine.progress_file import FileProgressLog
from reconcile.testing.harness import SinkHarness
from sinks.base import bind_writer
from tests.fix_sinks import HttpHarness, MemoryHarness

pytestmark = pytest.mark.integration

KINDS = ["memory", "file", "http", "delta"]
PIPELINE, SINK = "shop", "orders"


@pytest.fixture(params=KINDS)
def harness(request: pytest.FixtureRequest) -> SinkHarness:
    found: SinkHarness = request.getfixturevalue(f"{request.param}_harness")
    return found


def _rows(run: str, epoch: int) -> list[dict[str, Any]]:
    return [{"k": f"{run}-e{epoch}-r{i}", "v": epoch * 10 + i} for i in range(3)]


def _run(
    harness: SinkHarness, state: Path, run: str, epochs: list[int], *, starts: int = 1
) -> tuple[str, dict[int, CommitResult]]:
    """Run ``epochs`` as a pipeline with the progress log in ``state``; its log id, results."""
    log = FileProgressLog(state, PIPELINE)
    for _ in range(starts - 1):  # earlier restarts: a higher writer generation
        CommitCycle(PIPELINE, [harness.new_sink(SINK)], log).start()
    cycle = CommitCycle(PIPELINE, [harness.new_sink(SINK)], log)
    cycle.start()
    return log.log_id, {e: cycle.run_epoch(e, {SINK: _rows(run, e)}) for e in epochs}


def _plain(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(({k: v for k, v in r.items() if not k.startswith("_")} for r in rows), key=str)


def _assert_wrote_or_stopped(
    harness: SinkHarness, run: str, results: dict[int, CommitResult]
) -> list[int]:
    """Every success is in the sink with this run's rows; anything else is CommitFatal."""
    held = harness.committed(SINK)
    stopped = []
    for epoch, result in results.items():
        if isinstance(result, CommitSucceeded):
            assert _plain(held.get(epoch, [])) == _plain(_rows(run, epoch)), (
                f"epoch {epoch} reported {result} but the sink holds {held.get(epoch)}"
            )
        else:
            assert isinstance(result, CommitFatal), result
            stopped.append(epoch)
    return stopped


@pytest.mark.parametrize("state", ["fresh", "wiped"])
def test_a_new_progress_log_never_reports_an_epoch_it_did_not_write(
    harness: SinkHarness, tmp_path: Path, state: str
) -> None:
    first_log, first = _run(harness, tmp_path / "state-a", "a", [0, 1, 2])
    assert all(isinstance(r, CommitSucceeded) for r in first.values())
    if state == "wiped":
        shutil.rmtree(tmp_path / "state-a")  # a re-run with fresh state, same folder
        second_state = tmp_path / "state-a"
    else:
        second_state = tmp_path / "state-b"  # a smoke run's state, same names and sink
    second_log, second = _run(harness, second_state, "b", [0, 1, 2, 3])
    assert second_log != first_log
    stopped = _assert_wrote_or_stopped(harness, "b", second)
    assert stopped == [0, 1, 2]  # the epochs the first run holds
    for epoch in stopped:
        reason = second[epoch].reason  # type: ignore[union-attr]
        assert "is already committed" in reason and "NOT treated as committed" in reason
        assert first_log in reason and second_log in reason  # what was found, and ours
        assert "Resume with the original state" in reason  # what to do
    held = harness.committed(SINK)
    for epoch in (0, 1, 2):  # the first run's rows are untouched
        assert _plain(held[epoch]) == _plain(_rows("a", epoch))
    assert _plain(held[3]) == _plain(_rows("b", 3))


def test_a_new_progress_log_behind_an_older_generation_stops_too(
    harness: SinkHarness, tmp_path: Path
) -> None:
    # The first run restarted twice (generation 3); the new log starts at 1.
    _, first = _run(harness, tmp_path / "state-a", "a", [0, 1], starts=3)
    assert all(isinstance(r, CommitSucceeded) for r in first.values())
    _, second = _run(harness, tmp_path / "state-b", "b", [0, 1, 2])
    assert _assert_wrote_or_stopped(harness, "b", second) == [0, 1, 2]
    assert 2 not in harness.committed(SINK)


def test_the_same_progress_log_resumes_over_its_own_commits(
    harness: SinkHarness, tmp_path: Path
) -> None:
    _run(harness, tmp_path / "state", "a", [0, 1])
    # A restart with the same state: epoch 1 is replayed (a no-op), 2 is new.
    _, again = _run(harness, tmp_path / "state", "a", [1, 2])
    assert again[1] == CommitSucceeded(1, replayed=True)
    assert again[2] == CommitSucceeded(2)
    assert _assert_wrote_or_stopped(harness, "a", again) == []


def test_the_sink_itself_refuses_another_logs_commit(harness: SinkHarness) -> None:
    """Direct calls: the typed cause, at prepare and at commit, never OK."""
    writer_a, writer_b = WriterIdentity(PIPELINE, "log-a"), WriterIdentity(PIPELINE, "log-b")
    txn = SinkTxnId(PIPELINE, SINK, 5, 1)
    a = harness.new_sink(SINK)
    bind_writer(a, writer_a)
    assert a.stage(txn, _rows("a", 5)) == Ok() and a.prepare(txn) == Ok()
    assert a.commit(txn) == Ok() and a.commit(txn) == Ok()  # its own: idempotent
    b = harness.new_sink(SINK)
    bind_writer(b, writer_b)
    b.stage(txn, _rows("b", 5))
    for outcome in (b.prepare(txn), b.commit(txn), b.commit(txn.with_generation(2))):
        assert isinstance(outcome, Fatal), outcome
        assert isinstance(outcome.error, MarkerMismatchError), outcome
        assert "'log-a'" in outcome.reason and "'log-b'" in outcome.reason
    unbound = harness.new_sink(SINK)  # an unbound sink is its own writer, with no log
    assert isinstance(unbound.commit(txn), Fatal)
    assert _plain(harness.committed(SINK)[5]) == _plain(_rows("a", 5))


def test_a_batch_prepared_for_another_log_is_never_committed(harness: SinkHarness) -> None:
    # Two logs' writers can use the same txn id (both start at generation 1).
    txn = SinkTxnId(PIPELINE, SINK, 6, 1)
    a, b = harness.new_sink(SINK), harness.new_sink(SINK)
    bind_writer(a, WriterIdentity(PIPELINE, "log-a"))
    bind_writer(b, WriterIdentity(PIPELINE, "log-b"))
    assert a.stage(txn, _rows("a", 6)) == Ok() and a.prepare(txn) == Ok()
    outcome = b.commit(txn)
    assert isinstance(outcome, Fatal) and isinstance(outcome.error, MarkerMismatchError)
    assert "'log-a'" in outcome.reason and "'log-b'" in outcome.reason
    assert 6 not in harness.committed(SINK)
    assert a.commit(txn) == Ok()  # its own writer still can
    assert _plain(harness.committed(SINK)[6]) == _plain(_rows("a", 6))


def test_bind_is_idempotent_and_a_client_serves_one_writer(harness: SinkHarness) -> None:
    sink = harness.new_sink(SINK)
    writer = WriterIdentity(PIPELINE, "log-a")
    bind_writer(sink, writer)
    bind_writer(sink, WriterIdentity(PIPELINE, "log-a"))  # the same writer: fine
    with pytest.raises(ConfigurationError, match="serves one writer"):
        bind_writer(sink, WriterIdentity(PIPELINE, "log-b"))
    with pytest.raises(ConfigurationError, match="WriterIdentity"):
        bind_writer(sink, "log-a")


# ------------------------------------------------------------ commit logs


def _double_commit(sink_a: Any, sink_b: Any, forget: Any) -> None:
    """Commit epoch 0, make the keyed state forget it, commit it again."""
    txn = SinkTxnId(PIPELINE, SINK, 0, 1)
    for sink in (sink_a, sink_b):
        assert sink.stage(txn, _rows("a", 0)) == Ok() and sink.prepare(txn) == Ok()
        assert sink.commit(txn) == Ok()
        assert sink.commit(txn) == Ok()  # "already committed": not a commit performed
        forget(txn)


def test_the_memory_store_logs_every_commit_it_performs() -> None:
    harness = MemoryHarness()
    store = harness.store
    writer = WriterIdentity(PIPELINE, "log-a")
    sink_a, sink_b = harness.new_sink(SINK), harness.new_sink(SINK)
    for sink in (sink_a, sink_b):
        bind_writer(sink, writer)

    def forget(txn: SinkTxnId) -> None:
        del store.committed[txn.key]  # what a lost marker would look like

    _double_commit(sink_a, sink_b, forget)
    assert [(c.txn, c.rows, c.log_id) for c in store.commit_log] == [
        (f"{PIPELINE}-{SINK}-0-g1", _rows("a", 0), "log-a")
    ] * 2
    assert store.committed == {}  # the keyed state alone shows nothing twice


def test_the_http_receiver_logs_every_commit_it_performs(http_harness: HttpHarness) -> None:
    server = http_harness.server
    writer = WriterIdentity(PIPELINE, "log-a")
    sink_a, sink_b = http_harness.new_sink(SINK), http_harness.new_sink(SINK)
    for sink in (sink_a, sink_b):
        bind_writer(sink, writer)

    def forget(txn: SinkTxnId) -> None:
        with server.state.lock:
            del server.state.committed[txn.key]

    _double_commit(sink_a, sink_b, forget)
    with urllib.request.urlopen(f"{server.url}/commit-log", timeout=5) as response:
        logged = json.loads(response.read())
    assert (
        logged == [{"txn": f"{PIPELINE}-{SINK}-0-g1", "rows": _rows("a", 0), "log_id": "log-a"}] * 2
    )
    assert [c.txn for c in server.state.commit_log] == [f"{PIPELINE}-{SINK}-0-g1"] * 2
