"""Ambiguous COMMITs into a real Postgres, through the fault proxy, counted by how they resolved.

The cycle runs over a Postgres sink behind a TCP proxy that loses the COMMIT
(or its reply). The resolver asks the database; the series
``reconcile_ambiguous_commits_total`` must say what it decided and by what
evidence, and the table must hold every epoch once.
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from reconcile import CommitCycle, CommitSucceeded
from reconcile.cli.prometheus import PrometheusMetrics
from reconcile.testing.pg_proxy import DROP_AFTER_COMMIT, DROP_BEFORE_COMMIT, FaultProxy
from sinks.postgres.factory import postgres_sink
from tests.fix_pg import PgServer

pytestmark = [pytest.mark.integration, pytest.mark.chaos]


@pytest.fixture
def proxy(pg_server: PgServer) -> Iterator[FaultProxy]:
    p = FaultProxy(pg_server.port)
    yield p
    p.close()


def ambiguous(metrics: PrometheusMetrics) -> dict[tuple[str, str, str], float]:
    """(sink, resolution, decided_by) -> count, from a scrape."""
    out = {}
    for family in text_string_to_metric_families(metrics.exposition()):
        for s in family.samples:
            if s.name == "reconcile_ambiguous_commits_total":
                assert s.labels["pipeline"] == "shop"
                out[(s.labels["sink"], s.labels["resolution"], s.labels["decided_by"])] = s.value
    return out


@pytest.mark.parametrize(
    ("mode", "fault", "resolution"),
    [
        ("transactional", DROP_AFTER_COMMIT, "committed"),
        ("transactional", DROP_BEFORE_COMMIT, "aborted"),
        ("prepared", DROP_AFTER_COMMIT, "committed"),
    ],
)
def test_a_lost_commit_is_counted_by_resolution_and_evidence(
    pg_server: PgServer, proxy: FaultProxy, tmp_path: object, mode: str, fault: str, resolution: str
) -> None:
    db = pg_server.create_database()
    with pg_server.connect(db) as conn:
        conn.execute("CREATE TABLE orders (k int PRIMARY KEY, v int)")
    metrics = PrometheusMetrics()
    sink = postgres_sink(
        pg_server.dsn(db, port=str(proxy.port)), "orders", mode=mode, name="orders"
    )
    cycle = CommitCycle("shop", [sink], f"{tmp_path}/progress", metrics=metrics)
    cycle.start()
    assert cycle.run_epoch(0, {"orders": [{"k": 0, "v": 0}]}) == CommitSucceeded(0)
    assert ambiguous(metrics) == {}
    proxy.arm(fault)
    assert cycle.run_epoch(1, {"orders": [{"k": 1, "v": 1}]}) == CommitSucceeded(1)
    assert proxy.fired.is_set()
    cycle.close()
    assert ambiguous(metrics) == {("orders", resolution, "pg_xact_status"): 1}
    assert sink.last_resolution is not None
    assert sink.last_resolution.resolution.value == resolution
    # The database holds each epoch once, whatever the resolution was.
    with psycopg.connect(pg_server.dsn(db)) as conn:
        rows = conn.execute("SELECT k, v FROM orders ORDER BY k").fetchall()
        markers = conn.execute(
            "SELECT epoch FROM reconcile.reconcile_commits ORDER BY epoch"
        ).fetchall()
    assert rows == [(0, 0), (1, 1)] and markers == [(0,), (1,)]
