"""A marker row forged for an epoch the store never decided, on real PostgreSQL and MariaDB.

What a co-tenant who can insert into the marker table writes: the next
epoch's marker, with the log id and target copied from the rows already
there. The next epoch must stop loudly (an UntrustedRecordError naming the
marker and the epoch), never report success with nothing written: the
assertions count the target's rows in the database itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest

from reconcile.core.contract import UntrustedRecordError
from reconcile.core.metrics import InMemoryMetrics
from reconcile.engine.cycle import CommitCycle, CommitFatal, CommitSucceeded
from reconcile.engine.progress_file import read_progress
from sinks.postgres.factory import postgres_sink
from sinks.sql.sink import SqlSink
from tests.mariadb_server import MariadbServer

pytestmark = pytest.mark.integration

PIPE = "shop"


def rows(epoch: int) -> list[dict[str, Any]]:
    return [{"k": f"e{epoch}-r{i}", "v": epoch * 100 + i} for i in range(10)]


def run(sink: Any, state: Path, epochs: range, metrics: InMemoryMetrics | None = None) -> list[Any]:
    cycle = CommitCycle(PIPE, [sink], state, metrics=metrics)
    cycle.start()
    try:
        return [cycle.run_epoch(e, {"orders": rows(e)}) for e in epochs]
    finally:
        cycle.close()


def refused(result: Any, metrics: InMemoryMetrics, epoch: int) -> None:
    assert isinstance(result, CommitFatal) and not result.restart, result
    assert isinstance(result.error, UntrustedRecordError)
    assert f"marker of epoch {epoch}" in result.reason and "epochs up to 1" in result.reason
    assert metrics.value("sink.untrusted_record", sink="orders", kind="commit") >= 1


@pytest.mark.parametrize("mode", ["transactional", "prepared"])
def test_postgres_a_forged_marker_of_the_next_epoch_stops_it_loudly(
    pg_db: str, tmp_path: Path, mode: str
) -> None:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE a (k text PRIMARY KEY, v bigint, _epoch bigint)")
    state = tmp_path / "state"
    results = run(postgres_sink(pg_db, "a", mode=mode, name="orders"), state, range(2))
    assert all(isinstance(r, CommitSucceeded) for r in results)
    log_id = read_progress(state, PIPE).log_id
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO reconcile.reconcile_commits (pipeline, sink, epoch, target_schema, "
            "target_table, log_id, xid, backend_pid, generation, row_count) VALUES "
            "(%s, 'orders', 2, 'public', 'a', %s, pg_current_xact_id(), 0, 1, 10)",
            (PIPE, log_id),
        )
    metrics = InMemoryMetrics()
    [result] = run(postgres_sink(pg_db, "a", mode=mode, name="orders"), state, range(2, 3),
                   metrics)  # fmt: skip
    refused(result, metrics, 2)
    with psycopg.connect(pg_db, autocommit=True) as conn:
        found = conn.execute("SELECT count(*) FROM a WHERE _epoch = 2").fetchone()
    assert found == (0,)


def test_mariadb_a_forged_marker_of_the_next_epoch_stops_it_loudly(
    mariadb_server: MariadbServer, tmp_path: Path
) -> None:
    db = mariadb_server.create_database("claims")
    try:
        with mariadb_server.connect(db) as conn, conn.cursor() as cur:
            cur.execute(
                "CREATE TABLE orders (k VARCHAR(20) COLLATE utf8mb4_nopad_bin PRIMARY KEY, "
                "v BIGINT) ENGINE=InnoDB"
            )
        state = tmp_path / "state"
        url = mariadb_server.url(db)
        results = run(SqlSink(url, "orders", name="orders"), state, range(2))
        assert all(isinstance(r, CommitSucceeded) for r in results)
        # The log id copied from the fence row, as a co-tenant reads it.
        with mariadb_server.connect(db) as conn, conn.cursor() as cur:
            cur.execute("SELECT log_id FROM reconcile_sql_fences WHERE pipeline = %s", (PIPE,))
            (log_id,) = cur.fetchone()  # type: ignore[misc]
            cur.execute(
                "INSERT INTO reconcile_sql_commits (pipeline, sink, epoch, target_table, log_id, "
                "generation, row_count) VALUES (%s, 'orders', 2, 'orders', %s, 1, 10)",
                (PIPE, log_id),
            )
        metrics = InMemoryMetrics()
        [result] = run(SqlSink(url, "orders", name="orders"), state, range(2, 3), metrics)
        refused(result, metrics, 2)
        with mariadb_server.connect(db) as conn, conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM orders WHERE k LIKE 'e2-%%'")
            assert cur.fetchone() == (0,)
    finally:
        mariadb_server.drop_database(db)
