"""Fixture plugin: the ``sink_harness`` fixture, parametrized over every sink kind."""

from __future__ import annotations

import pytest

from tests.harness import SinkHarness

# Every sink kind with a ``<kind>_harness`` fixture somewhere in the plugins.
# The contract and chaos suites run once per kind listed here.
SINK_KINDS = ["memory", "file", "http"]


@pytest.fixture(params=SINK_KINDS)
def sink_harness(request: pytest.FixtureRequest) -> SinkHarness:
    """A harness for each sink kind, built by that kind's own fixture."""
    harness: SinkHarness = request.getfixturevalue(f"{request.param}_harness")
    return harness
