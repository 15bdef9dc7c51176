"""The latency benchmark's feed: one file per trigger interval, at a seeded point of it.

Spark fires a processing-time trigger at wall-clock multiples of its interval
(``ProcessingTimeExecutor``), not from the query's start. Files dropped at a
fixed pace, one per interval, would all land at one phase of that clock, a
phase set by when the feed happened to start: just before a trigger, and
every row waits only for its batch; just after one, and every row waits a
whole interval more. That phase differs from run to run and from mode to
mode, and moved a mode's every latency by up to an interval, more than the
modes differ. So the feed starts on a multiple of the interval, and file i
lands at a seeded random point of the i-th interval after it: the same
points for every mode of a run, spread evenly over the interval, so that
each mode's percentiles include the wait for the trigger as a stream with
arrivals at any moment would see it.
"""

from __future__ import annotations

import math
import random
import threading
import time

from reconcile.demo.tpch.data import Feed

__all__ = ["Feeder", "landing_points"]


def landing_points(files: int, interval: float, seed: int) -> list[float]:
    """Seconds after the feed's start at which files 1..``files`` land, one per interval."""
    rng = random.Random(seed)
    return [(i + rng.random()) * interval for i in range(files)]


class Feeder(threading.Thread):
    """Drops files 1.. one per interval, each at its seeded point (``landing_points``)."""

    def __init__(self, feed: Feed, interval: float, *, seed: int) -> None:
        super().__init__(daemon=True, name="feeder")
        self.feed, self.interval = feed, interval
        self.points = landing_points(len(feed.slices) - 1, interval, seed)
        self.stop = threading.Event()
        self.start_at = 0.0  # wall-clock time of the feed's start (0: not started)

    def run(self) -> None:
        # On a wall-clock multiple of the interval, where Spark's trigger fires; an
        # interval of 0 (the stream as fast as it goes) drops every file at once.
        now = time.time()
        self.start_at = math.ceil(now / self.interval) * self.interval if self.interval else now
        for part, point in zip(self.feed.slices[1:], self.points, strict=True):
            if self.stop.wait(max(0.0, self.start_at + point - time.time())):
                return
            self.feed.drop(part.index)
