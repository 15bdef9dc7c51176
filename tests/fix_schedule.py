"""Plugin: the order of a run: the tests that take minutes start first.

The default run is parallel (``scripts/test``: pytest-xdist, one process per
worker, each with its own Postgres server and Spark session). xdist's
``worksteal`` scheduling splits the collected tests among the workers in
order, and a worker that runs out takes from the others' queues; tests
collected last run last.
The slowest tests (a Spark pipeline in a subprocess, killed and run again; the
demo; the HA takeover) sit late in the alphabet, so without this hook they
ran together at the end and the run waited on them alone.

A test that takes minutes declares it with a larger time limit
(``@pytest.mark.timeout(900)``; the default, in ``pyproject.toml``, is 300 s
and is there to turn a hang into a failure with a traceback). Those tests are
put first, longest limit first, in collection order otherwise, so they spread
over the workers from the start while the many short tests fill the gaps.

A run that stops at its first failure (``-x``, as each run of the mutation
check does) wants the opposite order: the cheap tests first, so that one that
fails ends the run before a minute-long one starts. Cheap is the default limit
before a larger one, then no Spark before Spark, then no server before a
server (the ``spark`` and ``integration`` marks).
"""

from __future__ import annotations

from typing import Any

import pytest


def _time_limit(item: pytest.Item) -> float:
    marker = item.get_closest_marker("timeout")
    if marker is None:
        return 0.0
    limit = marker.args[0] if marker.args else marker.kwargs.get("timeout", 0)
    return float(limit or 0)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[Any]) -> None:
    # Stable: equal limits keep the collection order (and so fixtures' locality).
    if config.option.maxfail == 1:
        items.sort(key=_cost)
    else:
        items.sort(key=lambda item: -_time_limit(item))


def _cost(item: pytest.Item) -> tuple[float, bool, bool]:
    marks = {mark.name for mark in item.iter_markers()}
    return _time_limit(item), "spark" in marks, "integration" in marks
