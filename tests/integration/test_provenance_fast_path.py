"""Provenance of rows the PostgreSQL direct-COPY fast path wrote: the engine's, on real Postgres.

A large Arrow epoch into a free integer key range is COPied straight into the
table. Its rows must carry the xid the epoch's marker records (no
subtransaction of their own), so that verify names them the engine's, while a
hand edit among them is still foreign, and the foreign-writes gauge counts
the foreign ROWS (three rows of one hand edit count three).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from psycopg import sql

from reconcile import CommitCycle, CommitSucceeded
from reconcile.recovery import recover
from sinks.postgres import apply
from sinks.postgres.factory import postgres_sink
from tests.cli_run import cli
from tests.fix_pg import PgServer, markers_table
from tests.recovery_setup import SIMPLE_DDL, SIMPLE_SCHEMA, Setup, make_setup

pytestmark = pytest.mark.integration

ROWS = 12_000  # above the fast path's threshold (10,000 Arrow rows)


@pytest.fixture(scope="module")
def tracking_server() -> Iterator[PgServer]:
    server = PgServer(track_commit_timestamp="on")
    yield server
    server.stop()


@pytest.fixture
def fast(
    tracking_server: PgServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Setup]:
    """``orders`` with rows 0..ROWS-1 written by epoch 0 through the direct COPY (asserted)."""
    name = tracking_server.create_database()
    setup = make_setup(tracking_server.dsn(name), str(tmp_path), "orders", SIMPLE_SCHEMA,
                       SIMPLE_DDL, ["id"])  # fmt: skip
    into: list[str] = []
    real = apply._copy_arrow

    def copy_arrow(cur: Any, target: Any, table: pa.Table) -> None:
        into.append(target.as_string(cur))
        real(cur, target, table)

    monkeypatch.setattr(apply, "_copy_arrow", copy_arrow)
    rows = pa.table(
        {
            "id": pa.array(range(ROWS), pa.int64()),
            "name": pa.array([f"n{i}" for i in range(ROWS)]),
            "total": pa.array(range(ROWS), pa.int64()),
        }
    )
    epoch = setup.record(rows.to_pylist())
    cycle = CommitCycle(
        setup.pipeline,
        [postgres_sink(setup.dsn, "orders", name="orders", create_epoch_column=True)],
        setup.state,
    )
    try:
        cycle.start()
        assert isinstance(cycle.run_epoch(epoch, {"orders": rows}), CommitSucceeded)
    finally:
        cycle.close()
    # The fast path was taken: Arrow's COPY went straight into the table.
    assert into == ['"public"."orders"'], into
    yield setup
    tracking_server.drop_database(name)


def marker_xids(dsn: str) -> list[str]:
    with psycopg.connect(dsn) as conn:
        table = markers_table(conn)
        assert table is not None
        rows = conn.execute(sql.SQL("SELECT xid::text FROM {} ORDER BY epoch").format(table))
        return [str(r[0]) for r in rows]


def hand_edit(dsn: str, statement: str) -> str:
    with psycopg.connect(dsn) as conn:
        conn.execute(statement)
        row = conn.execute("SELECT pg_current_xact_id()::text").fetchone()
        assert row is not None
        return str(row[0])


def test_fast_path_rows_are_the_engines_and_a_hand_edit_is_foreign(fast: Setup) -> None:
    [epoch_xid] = marker_xids(fast.dsn)
    xid = hand_edit(fast.dsn, "UPDATE orders SET total = -1 WHERE id IN (3, 4, 5)")
    # The store moves on without the sink for rows 7 and 8: they now differ,
    # last written by epoch 0's direct COPY.
    fast.record([{"id": 7, "name": "m7", "total": 70}, {"id": 8, "name": "m8", "total": 80}])
    report = recover(fast.dsn, fast.root, fast.pipeline, fast.table, dry_run=True, mode="full")
    assert report.changed == 5
    writers = {r["key"]["id"]: (r["writer"], r["xid"]) for r in report.provenance}
    assert writers == {
        3: ("foreign", xid), 4: ("foreign", xid), 5: ("foreign", xid),
        7: ("engine", epoch_xid), 8: ("engine", epoch_xid),
    }  # fmt: skip
    # Rows, not transactions: one hand edit of three rows is three foreign writes.
    assert report.foreign_writes == 3


@pytest.mark.slow
def test_watch_exports_the_foreign_rows_only(fast: Setup, tmp_path: Path) -> None:
    config = tmp_path / "reconcile.toml"
    config.write_text(
        f"""
[store]
root = "{fast.root}"

[metrics]
textfile = "metrics.prom"

[pipelines.shop.sinks.orders]
dsn = "{fast.dsn}"
table = "orders"
keys = ["id"]
mode = "full"
"""
    )
    hand_edit(fast.dsn, "UPDATE orders SET total = -1 WHERE id IN (1, 2)")
    fast.record([{"id": 9, "name": "m9", "total": 90}])  # the fast path's row, differing
    watched = cli("watch", "--config", str(config), "--every", "1s", "--count", "1")
    assert watched.returncode == 1, watched.stderr
    assert "2 rows written by 1 foreign transaction" in watched.stdout, watched.stdout
    exported = (tmp_path / "metrics.prom").read_text()
    assert 'reconcile_drift_foreign_writes{pipeline="shop",table="public.orders"} 2.0' in exported
