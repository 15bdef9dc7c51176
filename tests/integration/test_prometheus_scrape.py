"""The /metrics endpoint, scraped over HTTP while a pipeline runs, agrees with what it wrote.

The pipeline runs ``drive()`` over two file sinks in a thread; its progress
callback hands over to the test after every epoch's attempt and waits, so each
scrape happens mid-run at a known point, never after a sleep. Each scrape is
checked against the batch files the sinks committed on disk.
"""

from __future__ import annotations

import queue
import threading
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from reconcile import CommitCycle, CommitFatal, CommitResult, RetryPolicy, drive
from reconcile.cli.prometheus import PrometheusMetrics
from reconcile.engine.faults import Fault, FaultKind, FaultPlan
from sinks.files.layout import read_header
from sinks.files.sink import FileSink

pytestmark = pytest.mark.integration

EPOCHS = 6
SINKS = ("archive", "totals")


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.status == 200
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def on_disk(root: Path, sink: str) -> list[int]:
    """The epochs the sink committed, read from its committed batch files."""
    folder = root / sink / "committed"
    if not folder.exists():
        return []
    return sorted(int(read_header(p)["epoch"]) for p in folder.glob("*.batch"))


def test_scrapes_between_epochs_match_the_sinks(tmp_path: Path) -> None:
    metrics = PrometheusMetrics()
    # The 4th begin (epoch 3's first attempt) fails Fatal: drive() restarts.
    plan = FaultPlan([Fault("cycle.begin", FaultKind.FATAL, nth=4)])
    root = tmp_path / "sinks"

    def build() -> CommitCycle:
        sinks = [FileSink(name, root) for name in SINKS]
        return CommitCycle("shop", sinks, tmp_path / "state", metrics=metrics, faults=plan)

    attempts: queue.Queue[tuple[int, CommitResult] | BaseException] = queue.Queue()
    resume = threading.Semaphore(0)

    def progress(epoch: int, result: CommitResult) -> None:
        attempts.put((epoch, result))
        assert resume.acquire(timeout=60), "the test never let the pipeline go on"

    def pipeline() -> None:
        try:
            drive(
                build,
                range(EPOCHS),
                lambda e: {"archive": [{"id": e}], "totals": [{"n": e}]},
                retry=RetryPolicy(initial_s=0.0, max_s=0.0, jitter_s=0.0),
                on_progress=progress,
            )
        except BaseException as exc:  # reach the test thread, not a thread's stderr
            attempts.put(exc)

    with metrics.serve() as server:
        runner = threading.Thread(target=pipeline, name="pipeline")
        runner.start()
        succeeded = fatal = 0
        try:
            for _ in range(EPOCHS + 1):  # every epoch once, plus the Fatal attempt
                item = attempts.get(timeout=60)
                assert not isinstance(item, BaseException), item
                _, result = item
                if isinstance(result, CommitFatal):
                    fatal += 1
                else:
                    succeeded += 1
                # The pipeline is blocked in its callback, mid-run: scrape now.
                got = scrape(server.url)
                committed = on_disk(root, "archive")
                assert on_disk(root, "totals") == committed
                shop = (("pipeline", "shop"),)
                assert got[("reconcile_commits_total", (("outcome", "succeeded"), *shop))] == len(
                    committed
                )
                assert got[("reconcile_commits_total", (("outcome", "fatal"), *shop))] == fatal
                assert got[("reconcile_commit_fatal_total", shop)] == fatal
                assert got[("reconcile_last_committed_epoch", shop)] == committed[-1]
                assert got[("reconcile_epoch_lag_seconds", shop)] >= 0
                assert len(committed) == succeeded
                resume.release()
        finally:
            for _ in range(2 * EPOCHS):  # a failed check must not leave the pipeline waiting
                resume.release()
            runner.join(timeout=60)
        assert not runner.is_alive()
        assert attempts.empty()
        final = scrape(server.url)
    assert on_disk(root, "archive") == list(range(EPOCHS))
    assert fatal == 1
    shop = (("pipeline", "shop"),)
    assert final[("reconcile_commits_total", (("outcome", "succeeded"), *shop))] == EPOCHS
    assert final[("reconcile_commit_fatal_total", shop)] == 1
    # The Fatal at begin asked for a restart: one more start(), one drive retry.
    assert final[("reconcile_recovery_seconds_count", shop)] == 2
    assert final[("reconcile_drive_retries_total", (*shop, ("restart", "true")))] == 1
    assert final[("reconcile_step_seconds_count", (*shop, ("step", "commit")))] == EPOCHS
