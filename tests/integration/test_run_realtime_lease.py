"""``reconcile run`` under Real-Time Mode gives its query up with the lease (a real PostgreSQL).

The lead loop (``reconcile.cli.run_realtime``) renews the lease in the
database while the query runs. When another holder has taken the lease (here:
the row rewritten as a newer tenure of another node, as a takeover leaves it),
the next renewal fails and the loop returns at once, so that the caller stops
the query: two drivers must not stream the same partitions. A query that fails
is raised; one that ends by itself ends the loop. The query is a stand-in that
records what the loop did with it (the loop reads only ``isActive`` and
``exception()``); the lease is the real one.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import psycopg
import pytest

from reconcile.cli.config import load_config
from reconcile.cli.run_realtime import _lead
from reconcile.ha import open_lease
from tests.unit.test_config import ENV, MINIMAL, write
from tests.unit.test_config_run import RUN

pytestmark = pytest.mark.integration


class Query:
    """What the loop sees of a StreamingQuery: whether it runs, and how it failed."""

    def __init__(self, failure: Exception | None = None) -> None:
        self.isActive = True
        self.failure = failure

    def exception(self) -> Exception | None:
        return self.failure


def pipeline(tmp_path: Path) -> object:
    text = MINIMAL + RUN + 'realtime = "5 seconds"\n'
    return load_config(write(tmp_path, text), env=ENV).pipeline("orders")


def test_a_lease_taken_by_another_node_ends_the_lead_at_the_next_renewal(
    pg_db: str, tmp_path: Path
) -> None:
    lease = open_lease(pg_db, "orders", term_s=0.8)
    assert lease.try_acquire() is not None and lease.tenure is not None
    outcome: list[bool] = []
    stop = threading.Event()
    lead = threading.Thread(target=lambda: outcome.append(
        _lead(pipeline(tmp_path), lease, Query(), stop)))  # type: ignore[arg-type]  # fmt: skip
    lead.start()
    time.sleep(1.0)  # renewals go through: the loop keeps leading past its term
    assert lead.is_alive() and lease.held()
    with psycopg.connect(pg_db, autocommit=True) as conn:
        taken = conn.execute(
            "UPDATE reconcile.reconcile_leases SET holder = 'other:1', tenure = tenure + 1, "
            "expires_at = clock_timestamp() + interval '1 hour' WHERE pipeline = 'orders'"
        ).rowcount
    assert taken == 1
    lead.join(timeout=5)
    stop.set()
    assert not lead.is_alive() and outcome == [False]  # lost: the caller stops the query
    assert not lease.held()
    lease.close()


def test_a_failed_query_is_raised_and_a_finished_one_ends_the_lead(
    pg_db: str, tmp_path: Path
) -> None:
    lease = open_lease(pg_db, "orders", term_s=0.4)
    assert lease.try_acquire() is not None
    failed = Query(RuntimeError("task failed 4 times"))
    failed.isActive = False
    with pytest.raises(RuntimeError, match="task failed 4 times"):
        _lead(pipeline(tmp_path), lease, failed, threading.Event())  # type: ignore[arg-type]
    finished = Query()
    finished.isActive = False
    assert _lead(pipeline(tmp_path), lease, finished, threading.Event()) is True  # type: ignore[arg-type]
    lease.release()
    lease.close()
