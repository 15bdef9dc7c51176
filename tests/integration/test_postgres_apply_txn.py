"""The direct-COPY fast path's own transaction: no subtransaction, and what a key conflict means.

The fast path COPies a large Arrow epoch straight into the table in the
epoch's transaction, never under a savepoint, so every row carries the xid
its marker records. A key conflict there is either a concurrent writer's key
(the epoch is retried: ``test_postgres_sink.py``) or another unique index,
which the general path refuses too: the same rejection at every size.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg import sql

from reconcile.core.contract import OK, Fatal, RejectedError
from sinks.postgres.sink import PostgresSink
from tests.fix_pg import PgServer, markers_table
from tests.integration.test_postgres_apply_fastpath import (
    MODES,
    SIZES,
    arrow_rows,
    counts,
    one_epoch,
    run_case,
    stage_tables,
)

pytestmark = pytest.mark.integration

PIPE = "pipe"


@pytest.mark.parametrize("mode", MODES)
def test_another_unique_index_refuses_the_epoch_at_every_size(
    pg_server: PgServer, mode: str
) -> None:
    # ON CONFLICT (id) does not cover a unique index on another column: the
    # general path is refused on it. The fast path must give the same
    # rejection, never take it for a concurrent writer's key and retry.
    def setup(conn: psycopg.Connection[Any]) -> None:
        conn.execute("CREATE TABLE t (id bigint PRIMARY KEY, v bigint UNIQUE)")
        conn.execute("INSERT INTO t VALUES (-1, 7)")  # outside the epoch's key range

    for n in SIZES:
        got = run_case(pg_server, mode, n, setup, arrow_rows(n), counts)
        assert isinstance(got.outcome, Fatal), (n, got.outcome)
        assert isinstance(got.outcome.error, RejectedError), (n, got.outcome)
        assert got.outcome.error.details.get("constraint") == "t_v_key", got.outcome.error.details
        assert got.state == {"rows": 1, "markers": 0}, n


def test_a_fast_path_epoch_writes_its_rows_with_the_marker_s_xid(pg_db: str) -> None:
    # No subtransaction: every row carries the xid its marker records, which
    # is how provenance tells the engine's rows from a hand edit's.
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id bigint PRIMARY KEY, v bigint)")
    sink = PostgresSink(pg_db, "t", name="t", pipeline=PIPE)
    try:
        assert one_epoch(sink, arrow_rows(20_000)) == OK
        assert stage_tables(pg_db) == 0  # the fast path: no temp staging table
    finally:
        sink.close()
    with psycopg.connect(pg_db, autocommit=True) as conn:
        table = markers_table(conn)
        assert table is not None
        found = conn.execute(
            sql.SQL(
                "SELECT count(*) FILTER (WHERE t.xmin::text = "
                "(m.xid::text::bigint % 4294967296)::text), count(*) FROM t, {} m"
            ).format(table)
        ).fetchone()
    assert found == (20_000, 20_000)
