"""A reader taking its hold races vacuum: the reader keeps a whole version or says which it lost.

A reader resolves a store version, then writes its hold; a vacuum that listed
the holds in between does not keep that version. Vacuum writes a "running"
record before it lists the holds, and a reader that finds one after writing its
hold waits it out, then checks the version it holds is whole
(``expected_state.vacuum_record``). Each race is staged at its exact window
with the hook points (``reconcile.core.hooks``), in real threads and a real
killed process, on a real store on disk and on S3 (moto); what is kept or lost
is read from the storage's own listing and the Delta log.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.fs as pafs
import pytest
from deltalake import DeltaTable

from expected_state.delta_files import filesystem
from expected_state.holds import HOLD_WRITING, HOLDS_DIR, HoldLostError
from expected_state.housekeeping import VACUUM_LISTED
from expected_state.store import ExpectedStateStore
from expected_state.vacuum_record import VACUUM_SUFFIX
from reconcile.core import hooks
from tests.integration.test_store_holds import _as_map, _epochs

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.int64())])
WAIT_S = 30.0  # a bound on every wait, so that a broken run fails instead of hanging
VACUUM = {"keep_epochs": 1, "retention_hours": 0, "safety_margin_minutes": 0}


def _store(root: str) -> ExpectedStateStore:
    return ExpectedStateStore(root, "shop", "orders", ["k"], schema=SCHEMA)


def _on_storage(uri: str) -> set[str]:
    """The table's files as the storage lists them, relative to its root."""
    fs, root = filesystem(uri)
    infos = fs.get_file_info(pafs.FileSelector(root, recursive=True))
    return {i.path.removeprefix(f"{root}/") for i in infos if i.type == pafs.FileType.File}


def _files_of(uri: str, version: int) -> set[str]:
    """The data files ``version`` references, as its Delta log says."""
    actions = pa.table(DeltaTable(uri, version=version).get_add_actions(flatten=False))
    return {unquote(p) for p in actions.column("path").to_pylist()}


def _recorded_holds(uri: str) -> set[int]:
    """The versions the hold records on the storage name (read as any reader reads them)."""
    fs, root = filesystem(uri)
    found: set[int] = set()
    for info in fs.get_file_info(pafs.FileSelector(f"{root}/{HOLDS_DIR}", allow_not_found=True)):
        if info.path.endswith(".json"):
            with fs.open_input_stream(info.path) as stream:
                found.update(json.loads(stream.read())["versions"])
    return found


def _await(what: Callable[[], bool], why: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not what():
        assert time.monotonic() < deadline, why
        time.sleep(0.05)


def _thread(target: Callable[[], Any], outcome: dict[str, Any], key: str) -> threading.Thread:
    def run() -> None:
        try:
            outcome[key] = target()
        except Exception as exc:
            outcome[f"{key}_error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _paused_vacuum(
    writer: ExpectedStateStore,
    version: int,
    outcome: dict[str, Any],
    start_reader: Callable[[], None],
) -> None:
    """Run a vacuum; once it listed the holds, start the reader, and let the vacuum go
    on only once ``version`` is recorded as held (written between listing and deleting)."""
    listed, go = threading.Event(), threading.Event()

    def pause() -> None:
        listed.set()
        assert go.wait(WAIT_S)

    with hooks.at(VACUUM_LISTED, pause) as armed:
        vacuum = _thread(lambda: writer.vacuum(**VACUUM), outcome, "vacuum")
        assert listed.wait(WAIT_S), "the vacuum never reached its listing"
        start_reader()
        _await(lambda: version in _recorded_holds(writer.uri), f"no hold on {version} written")
        go.set()
        vacuum.join(WAIT_S)
    assert armed.fired == 1
    assert not vacuum.is_alive() and "vacuum_error" not in outcome, outcome


@pytest.fixture
def root(where: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The store's root: a folder on disk, or a bucket of moto's S3 server."""
    if where == "local":
        return str(tmp_path / "expected")
    return f"s3://{request.getfixturevalue('s3_bucket')}/expected"


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_hold_written_after_vacuum_listed_the_holds_is_refused_by_name(root: str) -> None:
    writer = _store(root)
    states: dict[int, dict[int, int]] = {}
    _epochs(writer, 0, 9, states)
    writer.compact()  # epochs 0..8 folded: their own files only old versions reference
    _epochs(writer, 10, 11, states)  # the one epoch vacuum keeps reads the fold
    uri = writer.uri
    v2 = writer.version_of(2)
    needed = _files_of(uri, v2)
    reader = _store(root)  # a verify of its own, as another process would be
    vacuumed = threading.Event()
    outcome: dict[str, Any] = {}

    def read() -> Any:
        with reader.holding():
            first = reader.state_at_version(v2)  # resolves v2, then writes its hold
            assert vacuumed.wait(WAIT_S)
            # The same verify reads it again once the vacuum is over: it must be whole.
            return first, reader.state_at_version(v2)

    threads: list[threading.Thread] = []
    _paused_vacuum(writer, v2, outcome, lambda: threads.append(_thread(read, outcome, "read")))
    vacuumed.set()
    threads[0].join(WAIT_S)
    assert not threads[0].is_alive(), "the reader never ended"
    # The vacuum did not see the hold (listed before it): it deleted files v2 needs.
    assert needed - _on_storage(uri), "the race did not happen: nothing of v2 was deleted"
    # So the reader must not have read v2 at all: refused, naming table and version.
    assert "read" not in outcome, "a version with files gone was read"
    error = outcome["read_error"]
    assert isinstance(error, HoldLostError), error
    assert repr(uri) in str(error) and f"version {v2}" in str(error)
    assert _recorded_holds(uri) == set()  # released
    assert _as_map(_store(root).snapshot()) == states[11]


def test_a_reader_of_the_newest_version_reads_a_newer_one_when_vacuum_took_its_own(
    tmp_path: Path,
) -> None:
    root = str(tmp_path / "expected")
    writer = _store(root)
    states: dict[int, dict[int, int]] = {}
    _epochs(writer, 0, 9, states)
    uri = writer.uri
    resolved = DeltaTable(uri).version()
    needed = _files_of(uri, resolved)
    reader = _store(root)
    at_hold, go_hold = threading.Event(), threading.Event()
    outcome: dict[str, Any] = {}

    def between_resolving_and_holding() -> None:
        at_hold.set()
        assert go_hold.wait(WAIT_S)

    def read() -> Any:
        with reader.holding():
            return reader.snapshot()

    with hooks.at(HOLD_WRITING, between_resolving_and_holding) as paused:
        threads = [_thread(read, outcome, "read")]
        assert at_hold.wait(WAIT_S), "the reader never came to write its hold"
        # Resolved, not yet held: the pipeline moves on, and a vacuum lists the holds.
        _epochs(writer, 10, 10, states)
        writer.compact()
        _epochs(writer, 11, 11, states)
        _paused_vacuum(writer, resolved, outcome, go_hold.set)
    threads[0].join(WAIT_S)
    assert not threads[0].is_alive(), "the reader never ended"
    assert paused.fired == 1
    assert needed - _on_storage(uri), "the race did not happen: the resolved version is whole"
    assert "read_error" not in outcome, outcome.get("read_error")
    assert _as_map(outcome["read"]) == states[11]  # the newer version, read whole


_VACUUM = """
import sys
from expected_state.store import ExpectedStateStore
store = ExpectedStateStore(sys.argv[1], "shop", "orders", ["k"])
store.vacuum(keep_epochs=1, retention_hours=0, safety_margin_minutes=0, lease_s=float(sys.argv[2]))
"""


# On S3 it takes some 15 s (a process of its own, a lease to wait out over HTTP).
@pytest.mark.parametrize("where", ["local", pytest.param("s3", marks=pytest.mark.slow)])
def test_a_vacuum_killed_while_running_keeps_readers_waiting_no_longer_than_its_lease(
    root: str, tmp_path: Path
) -> None:
    writer = _store(root)
    states: dict[int, dict[int, int]] = {}
    _epochs(writer, 0, 9, states)
    writer.compact()
    _epochs(writer, 10, 11, states)
    uri = writer.uri
    v2 = writer.version_of(2)
    before = _on_storage(uri)
    fired = tmp_path / "killed"
    env = {**os.environ, "PYTHONPATH": str(REPO), "RECONCILE_KILL_ONCE": str(fired),
           "RECONCILE_KILL_AT": VACUUM_LISTED}  # fmt: skip
    run = subprocess.run([sys.executable, "-c", textwrap.dedent(_VACUUM), root, "3"],
                         env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert run.returncode == -9, run.stderr
    assert VACUUM_LISTED in fired.read_text()  # killed after it listed, before deleting
    records = {f for f in _on_storage(uri) if f.endswith(VACUUM_SUFFIX)}
    assert len(records) == 1, records  # its record outlives it
    assert before <= _on_storage(uri) | records  # nothing deleted
    reader = _store(root)
    outcome: dict[str, Any] = {}

    def read() -> Any:
        with reader.holding():
            return reader.snapshot(2)

    thread = _thread(read, outcome, "read")
    thread.join(WAIT_S)
    assert not thread.is_alive(), "a killed vacuum's record kept a reader waiting past its lease"
    assert "read_error" not in outcome, outcome.get("read_error")
    assert _as_map(outcome["read"]) == states[2]
    assert _files_of(uri, v2) <= _on_storage(uri)
    # The next vacuum drops the dead record, and runs to its end.
    writer.vacuum(**VACUUM)
    assert not {f for f in _on_storage(uri) if f.endswith(VACUUM_SUFFIX)}
    assert _as_map(_store(root).snapshot()) == states[11]


def test_a_holds_lease_is_judged_by_the_storages_clock_not_the_holders(tmp_path: Path) -> None:
    root = str(tmp_path / "expected")
    writer = _store(root)
    states: dict[int, dict[int, int]] = {}
    _epochs(writer, 0, 9, states)
    writer.compact()
    _epochs(writer, 10, 11, states)
    uri = writer.uri
    v2, v5 = writer.version_of(2), writer.version_of(5)
    holds = Path(uri) / HOLDS_DIR
    holds.mkdir()

    def record(name: str, version: int, expires: float) -> Path:
        path = holds / f"{name}.json"
        path.write_text(json.dumps({"versions": [version], "lease_s": 120, "expires": expires,
                                    "pid": 1, "host": name}))  # fmt: skip
        return path

    # Renewed just now by a host whose clock is an hour behind: its "expires" is
    # in the past by ours, yet its lease runs (the storage stamped it now).
    live = record("behind", v2, time.time() - 3600)
    # Last renewed ten minutes ago by a host an hour ahead (then killed): its
    # "expires" is in the future by ours, yet its lease ran out long ago.
    dead = record("ahead", v5, time.time() + 3600)
    os.utime(dead, (time.time() - 600, time.time() - 600))
    report = writer.vacuum(**VACUUM)
    assert v2 in report.kept_versions and v5 not in report.kept_versions
    assert _files_of(uri, v2) <= _on_storage(uri)
    assert _files_of(uri, v5) - _files_of(uri, v2) - _on_storage(uri)  # v5's own files went
    assert live.exists() and not dead.exists()
    assert _as_map(_store(root).snapshot(2)) == states[2]


def test_a_vacuum_paused_past_its_lease_deletes_nothing_when_it_resumes(tmp_path: Path) -> None:
    # A vacuum stalled (SIGSTOP: a VM pause, a long GC) after it listed the
    # holds: a reader waits out its lease, finds its version whole and reads it.
    # Resumed, the vacuum must not delete what that reader now relies on.
    root = str(tmp_path / "expected")
    writer = _store(root)
    states: dict[int, dict[int, int]] = {}
    _epochs(writer, 0, 9, states)
    writer.compact()
    _epochs(writer, 10, 11, states)
    uri = writer.uri
    v2 = writer.version_of(2)
    announce = tmp_path / "held"
    env = {**os.environ, "PYTHONPATH": str(REPO), "RECONCILE_HOLD_AT": VACUUM_LISTED,
           "RECONCILE_HOLD_FILE": str(announce), "RECONCILE_HOLD_SWALLOW": "1"}  # fmt: skip
    vacuum = subprocess.Popen([sys.executable, "-c", textwrap.dedent(_VACUUM), root, "2"],
                              env=env, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        _await(announce.exists, "the vacuum never reached its listing")
        os.kill(vacuum.pid, signal.SIGSTOP)
        reader = _store(root)
        first_read, resumed = threading.Event(), threading.Event()
        outcome: dict[str, Any] = {}

        def read() -> Any:
            with reader.holding():
                first = reader.state_at_version(v2)  # held after the vacuum listed
                first_read.set()
                assert resumed.wait(WAIT_S)
                return first, reader.state_at_version(v2)

        thread = _thread(read, outcome, "read")
        assert first_read.wait(WAIT_S), outcome.get("read_error")
        os.kill(vacuum.pid, signal.SIGCONT)
        os.kill(vacuum.pid, signal.SIGINT)  # ends the test's hold at the point: it goes on
        _, err = vacuum.communicate(timeout=WAIT_S)
    finally:
        if vacuum.poll() is None:
            os.kill(vacuum.pid, signal.SIGCONT)
            vacuum.kill()
            vacuum.wait()
    assert vacuum.returncode != 0 and "vacuum stopped" in err, err
    resumed.set()
    thread.join(WAIT_S)
    assert "read_error" not in outcome, outcome.get("read_error")
    first, again = outcome["read"]
    assert _as_map(first) == _as_map(again) == states[2]
    assert _files_of(uri, v2) <= _on_storage(uri)  # the resumed vacuum deleted none of them
    assert not {f for f in _on_storage(uri) if f.endswith(VACUUM_SUFFIX)}  # it left no record
