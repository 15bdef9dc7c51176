"""``hand_over``: a pull's batches worked on by a second thread, in order, one batch ahead.

The batches come from a generator that counts what was read, as a driver's
reader would hand them: the checks are what was read, what was worked on, on
which thread, and which exception reaches the caller.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from sinks.postgres.heavy import hand_over


class Batches:
    """Batches 0, 1, 2, ... up to ``count`` (then the end, or ``fail``), counting reads."""

    def __init__(self, count: int, fail: Exception | None = None) -> None:
        self.count, self.fail, self.read = count, fail, 0
        self.thread: threading.Thread | None = None

    def __iter__(self) -> Iterator[int]:
        self.thread = threading.current_thread()
        for batch in range(self.count):
            self.read += 1
            yield batch
        if self.fail is not None:
            raise self.fail


def test_every_batch_is_worked_on_in_order_on_one_other_thread() -> None:
    batches, seen, threads = Batches(50), [], set()

    def each(batch: int) -> None:
        seen.append(batch)
        threads.add(threading.current_thread())

    hand_over(batches, each)
    assert seen == list(range(50))
    assert len(threads) == 1 and batches.thread not in threads


def test_no_batch_at_all() -> None:
    seen: list[int] = []
    hand_over(Batches(0), seen.append)
    assert seen == []


def test_a_failing_batch_stops_the_reading_and_its_error_is_raised() -> None:
    batches = Batches(1000)

    def each(batch: int) -> None:
        if batch == 2:
            raise ValueError("batch 2 is bad")

    with pytest.raises(ValueError, match="batch 2 is bad"):
        hand_over(batches, each)
    # Read at most: the bad batch, the one waiting, the one being read when it failed.
    assert 3 <= batches.read <= 5


def test_a_failing_read_raises_after_the_batches_before_it_are_done() -> None:
    seen: list[int] = []

    def each(batch: int) -> None:
        time.sleep(0.05)  # slower than the reader: batches wait for it
        seen.append(batch)

    with pytest.raises(ConnectionError, match="server closed the connection"):
        hand_over(Batches(3, ConnectionError("server closed the connection")), each)
    assert seen == [0, 1, 2]


def test_the_reader_is_at_most_two_batches_ahead() -> None:
    batches, release = Batches(10), threading.Event()
    seen: list[int] = []

    def each(batch: int) -> None:
        release.wait(10)
        seen.append(batch)

    reading = threading.Thread(target=hand_over, args=(batches, each))
    reading.start()
    time.sleep(0.3)  # the worker holds batch 0; the reader fills the queue and waits
    assert batches.read == 3  # batch 0 worked on, batch 1 waiting, batch 2 read
    release.set()
    reading.join(10)
    assert seen == list(range(10))
