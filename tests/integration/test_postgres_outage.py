"""A Postgres server that goes away for 5 seconds in the middle of a pipeline run.

The driver must ride it out with backoff (not give up after a fraction of a
second), and the run must end with every epoch in the sink exactly once.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from reconcile.core.results import CommitResult, CommitSucceeded
from reconcile.engine.driver import drive
from reconcile.testing.scenario import Scenario
from tests.fix_pg import PgServer, PostgresHarness

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

EPOCHS = list(range(12))
OUTAGE_S = 5.0


@pytest.mark.parametrize("mode", ["transactional", "prepared"])
def test_a_five_second_server_restart_mid_run_is_ridden_out_exactly_once(
    private_pg_server: PgServer, mode: str, tmp_path: Path
) -> None:
    server = private_pg_server
    db = server.create_database("outage")
    scenario = Scenario(PostgresHarness(server.dsn(db), mode), tmp_path / "state")
    restarted = threading.Event()
    seen: dict[str, float] = {}

    def bring_back() -> None:
        time.sleep(OUTAGE_S)  # the outage itself, not a race window
        server.start()
        seen["back"] = time.monotonic()
        restarted.set()

    def on_progress(epoch: int, result: CommitResult) -> None:
        # Stop the server right after epoch 5 committed: the driver's next
        # epoch meets a server that is gone for OUTAGE_S seconds.
        if epoch == 5 and isinstance(result, CommitSucceeded) and "down" not in seen:
            server.shutdown("fast")
            seen["down"] = time.monotonic()
            threading.Thread(target=bring_back, daemon=True).start()
        if epoch > 5 and "first_after" not in seen:
            seen["first_after"] = time.monotonic()
        if epoch == 6 and isinstance(result, CommitSucceeded):
            seen["epoch_6_in"] = time.monotonic()

    report = drive(scenario.build, EPOCHS, scenario.outputs, on_progress=on_progress)
    assert restarted.wait(30)
    assert report.committed_epochs == EPOCHS
    # The outage really hit the run: epoch 6 was tried while the server was down
    # and only went through after it came back, with retries in between.
    assert seen["first_after"] - seen["down"] < 1.0
    assert report.retries + report.restarts > 0
    assert any(isinstance(r, CommitSucceeded) and r.epoch == 6 for r in report.results)
    scenario.check(EPOCHS)
