"""The latency benchmark's feed: one file per trigger interval, at a seeded point of it."""

from __future__ import annotations

from typing import Any

from benchmarks.latency.feed import Feeder, landing_points


def test_one_file_per_interval_at_seeded_points_spread_over_the_interval() -> None:
    points = landing_points(400, 1.0, seed=7)
    # File i lands inside interval i: never two in one trigger interval.
    assert all(i <= p < i + 1 for i, p in enumerate(points))
    # The same points for every mode of a run (same seed), other points for another seed.
    assert points == landing_points(400, 1.0, seed=7)
    assert points != landing_points(400, 1.0, seed=8)
    # Spread over the interval, not one phase: every tenth of it is hit.
    phases = [p - i for i, p in enumerate(points)]
    assert {int(phase * 10) for phase in phases} == set(range(10))
    # Scaled with the interval.
    assert landing_points(3, 0.5, seed=1) == [p / 2 for p in landing_points(3, 1.0, seed=1)]


def test_an_interval_of_zero_drops_every_file_at_once() -> None:
    dropped: list[int] = []

    class Slices:
        """A feed of five files that records its drops (the files themselves do not matter)."""

        slices = [type("Slice", (), {"index": i})() for i in range(5)]

        def drop(self, index: int) -> float:
            dropped.append(index)
            return 0.0

    feed: Any = Slices()
    feeder = Feeder(feed, 0.0, seed=3)
    feeder.start()
    feeder.join(timeout=5)
    assert not feeder.is_alive() and dropped == [1, 2, 3, 4]  # file 0 is the warm-up's
    assert landing_points(4, 0.0, seed=3) == [0.0] * 4
