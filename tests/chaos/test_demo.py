"""``reconcile demo`` end to end: the TPC-H stream under chaos, and a demo killed whole.

Both run the real command line in a subprocess against a database of the
test server, and then read PostgreSQL (``tests.demo_checks``): every line once
under the epoch of its file, every customer's revenue and line count equal to
what the TPC-H files add up to, one marker per sink and epoch.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from reconcile.demo.tpch.events import EventLog
from tests.demo_checks import (
    REPO,
    assert_sinks_exact,
    batches_of_files,
    demo_command,
    run_demo,
)

# The whole demo in subprocesses (Spark's JVM each time): minutes on a loaded machine.
pytestmark = [
    pytest.mark.integration,
    pytest.mark.chaos,
    pytest.mark.timeout(900),
]


@pytest.mark.spark  # in a subprocess
def test_demo_under_chaos_verifies_and_its_faults_fired(pg_db: str, tmp_path: Path) -> None:
    workdir = tmp_path / "demo"
    summary = run_demo(pg_db, workdir, "--epochs", "4", "--chaos", "3", "--crashes", "2",
                       "--drop-rate", "0.5", "--interval", "0.5")  # fmt: skip

    # The faults fired: each kill left its file (written by the dying process
    # at the point), and the proxy dropped connections around COMMIT.
    kills = sorted((workdir / "kills").iterdir())
    points = {path.read_text().split()[1] for path in kills}
    assert points == {"cycle.expected_state.recorded", "pg.commit.returned"}
    assert summary["crashes"] == len(kills) == 2
    assert sum(summary["connection_faults"].values()) >= 1
    assert summary["ambiguous_commits"] >= 1

    assert summary["verified"] is True
    assert (summary["missing"], summary["extra"], summary["changed"]) == (0, 0, 0)
    assert summary["epochs"] == 4
    assert summary["committed_epochs"] == len(set(batches_of_files(workdir).values()))
    assert_sinks_exact(pg_db, workdir, 4)

    # A restart does not wait for its pull-and-diff to start Spark: each pipeline
    # process that recovered the sinks had begun Spark's start first (its steps, as
    # it logged them in order), and started the stream only once they were settled.
    steps: dict[int, list[str]] = {}
    for entry in EventLog(workdir / "events.jsonl").read():
        steps.setdefault(entry["pid"], []).append(entry["event"])
    recovered = {pid: names for pid, names in steps.items() if "recovery" in names}
    assert recovered  # the kill after a sink's COMMIT left epochs to recover
    for names in recovered.values():
        assert names.index("spark_starting") < names.index("recovery"), names
        assert names.index("settled") < names.index("started"), names


@pytest.mark.slow  # in CI's slow chaos sample: keeps the default suite under 20 minutes
@pytest.mark.spark  # in a subprocess
def test_demo_killed_whole_resumes_with_the_same_workdir(pg_db: str, tmp_path: Path) -> None:
    workdir = tmp_path / "demo"
    cmd = demo_command(pg_db, workdir, "--epochs", "5", "--interval", "1")
    first = subprocess.Popen(cmd, cwd=REPO, start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    events = EventLog(workdir / "events.jsonl")
    deadline = time.monotonic() + 300
    while len(events.of("committed")) < 2:
        assert first.poll() is None, "the demo ended before it could be killed"
        assert time.monotonic() < deadline, "no epoch committed in time"
        time.sleep(0.2)
    # SIGKILL the supervisor, the pipeline, Spark's JVM and its Python workers at once.
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    pipeline = events.of("started")[-1]["pid"]
    for _ in range(100):
        try:
            os.killpg(first.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        raise AssertionError("a process of the killed demo is still alive")
    with pytest.raises(ProcessLookupError):
        os.kill(pipeline, 0)
    committed_before = {e["epoch"] for e in events.of("committed")}
    assert len(committed_before) >= 2 and not events.of("finished")

    summary = run_demo(pg_db, workdir, "--epochs", "5", "--interval", "1")
    assert summary["verified"] is True
    assert (summary["missing"], summary["extra"], summary["changed"]) == (0, 0, 0)
    assert len({e["pid"] for e in events.of("launch")}) == 2  # two supervisors ran
    assert_sinks_exact(pg_db, workdir, 5)
