"""The store's housekeeping runs between epochs on its own thread, never beside a store write."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from expected_state.store import APPLY_CHECKED
from reconcile import CommitCycle, CommitSucceeded
from reconcile.core import hooks
from reconcile.engine.expected import HOUSEKEEPING, ExpectedState
from sinks.memory import MemorySink, MemoryStore

pytestmark = [pytest.mark.integration]

WAIT_S = 30.0  # a bound on every wait, so that a broken run fails instead of hanging


def _cycle(tmp_path: Path) -> CommitCycle:
    expected = ExpectedState(str(tmp_path / "expected"), "orders", {"alpha": ["k"]})
    cycle = CommitCycle("orders", [MemorySink("alpha", MemoryStore())], expected_state=expected)
    cycle.start()
    return cycle


def _rows(epoch: int) -> dict[str, list[dict[str, int]]]:
    return {"alpha": [{"k": epoch % 3, "v": epoch}]}


def test_an_epoch_returns_while_its_housekeeping_still_runs(tmp_path: Path) -> None:
    cycle = _cycle(tmp_path)
    done: list[str] = []
    release, started = threading.Event(), threading.Event()

    def hold() -> None:
        started.set()
        release.wait(5.0)  # a run_epoch that waited for it would return after this
        done.append("housekeeping done")

    with hooks.at(HOUSEKEEPING, hold) as armed:
        assert cycle.run_epoch(0, _rows(0)) == CommitSucceeded(0)
        # run_epoch returned with its housekeeping held: it did not wait for it.
        assert done == []
        assert started.wait(WAIT_S), "the housekeeping of epoch 0 never started"
        release.set()
        cycle.close()  # waits for it
        assert done == ["housekeeping done"]
    assert armed.fired == 1


def _held(order: list[str]) -> tuple[threading.Event, threading.Event, Callable[[], None]]:
    """(release, started, hook): the hook holds the housekeeping until release is set."""
    release, started = threading.Event(), threading.Event()

    def hold() -> None:
        started.set()
        release.wait(WAIT_S)
        order.append("housekeeping done")

    return release, started, hold


def test_the_next_epoch_waits_for_the_housekeeping_before_it_touches_the_store(
    tmp_path: Path,
) -> None:
    cycle = _cycle(tmp_path)
    order: list[str] = []
    release, started, hold = _held(order)
    with hooks.at(HOUSEKEEPING, hold), hooks.at(APPLY_CHECKED, lambda: order.append("apply"),
                                                 nth=2) as applied:  # fmt: skip
        assert cycle.run_epoch(0, _rows(0)) == CommitSucceeded(0)
        assert started.wait(WAIT_S), "the housekeeping of epoch 0 never started"
        results: list[object] = []
        epoch_1 = threading.Thread(target=lambda: results.append(cycle.run_epoch(1, _rows(1))))
        epoch_1.start()
        # Room for epoch 1 to reach the store if nothing held it back.
        epoch_1.join(1.0)
        release.set()
        epoch_1.join(WAIT_S)
        assert results == [CommitSucceeded(1)]
        cycle.close()
    assert applied.fired == 1
    assert order[:2] == ["housekeeping done", "apply"]


def test_a_read_of_the_store_waits_for_the_housekeeping(tmp_path: Path) -> None:
    # A reader of the store beside the cycle (the demo's running totals read each
    # epoch's changes) must not read a table that a merge or vacuum is rewriting.
    cycle = _cycle(tmp_path)
    assert cycle.expected_state is not None
    order: list[str] = []
    release, started, hold = _held(order)
    with hooks.at(HOUSEKEEPING, hold):
        assert cycle.run_epoch(0, _rows(0)) == CommitSucceeded(0)
        assert started.wait(WAIT_S), "the housekeeping of epoch 0 never started"
        read: list[int] = []

        def reader() -> None:
            assert cycle.expected_state is not None
            read.append(cycle.expected_state.changes_of("alpha", 0).num_rows)
            order.append("read")

        thread = threading.Thread(target=reader)
        thread.start()
        thread.join(1.0)  # room for the read to happen if nothing held it back
        release.set()
        thread.join(WAIT_S)
        cycle.close()
    assert read == [1]
    assert order == ["housekeeping done", "read"]
