"""The staging tables' sweep after a committed micro-batch runs off the batch's path."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from reconcile.core import hooks
from reconcile.engine.cycle import CommitSucceeded
from reconcile.engine.driver import RetryPolicy
from reconcile.spark.batch_stage import STAGE_SWEEP, BatchStager
from reconcile.spark.staging import COLLECT_MAX_BYTES, StagePlan
from sinks.postgres.factory import postgres_sink
from sinks.postgres.shared_stage import PgSharedStage
from tests.cotenants import Tenants, make_tenants, rows, stage_epoch, staged_cycle
from tests.fix_pg import PgServer

pytestmark = [pytest.mark.integration]


@pytest.fixture
def tenants(pg_server: PgServer, pg_db: str) -> Tenants:
    return make_tenants(pg_server, pg_db)


def test_a_batch_returns_before_its_sweep_and_close_waits_for_it(
    tenants: Tenants, tmp_path: Path
) -> None:
    t = tenants
    t.run(None, f"GRANT CREATE ON DATABASE {t.db} TO {{app}}")
    cycle = staged_cycle(t, tmp_path, "p")
    staged = stage_epoch(t, cycle, 0, rows(range(3), "a"))
    assert isinstance(cycle.run_epoch(0, {"items": staged}), CommitSucceeded)
    client = postgres_sink(t.dsn(t.app), "items", name="items")
    store = cycle.expected_state.tables["items"]  # type: ignore[union-attr]
    plan = StagePlan("items", store.part_writer(rows(range(1), "x").schema),
                     PgSharedStage(client.target, staged.stage))  # fmt: skip
    stager = BatchStager(str(tmp_path / "staging"), "auto", COLLECT_MAX_BYTES, RetryPolicy())
    stager._plans[("items", "schema")] = plan  # as the executor path plans it
    count = f'SELECT count(*) FROM reconcile."{staged.stage[1]}"'
    release, started = threading.Event(), threading.Event()

    def hold() -> None:
        started.set()
        release.wait(5.0)  # a sweep on the batch's path would return only after this

    with hooks.at(STAGE_SWEEP, hold) as armed:
        stager.sweep("p", 0)
        assert t.scalar(count) == 3  # the batch went on; its staged rows are still there
        assert started.wait(30.0), "the sweep never started"
        release.set()
        stager.close()  # waits for it
    assert armed.fired == 1
    assert t.scalar(count) == 0
    cycle.close()
