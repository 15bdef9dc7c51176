"""The TwoPhaseSink contract (reconcile.testing.contract), run against every built-in sink kind.

These are the same checks a sink author runs with ``reconcile.testing.check_sink``.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from reconcile.testing.contract import CONTRACT_CHECKS
from reconcile.testing.harness import SinkHarness

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("check", CONTRACT_CHECKS, ids=[c.__name__ for c in CONTRACT_CHECKS])
def test_contract(check: Callable[[SinkHarness], None], sink_harness: SinkHarness) -> None:
    check(sink_harness)
