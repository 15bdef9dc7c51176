"""A definite rejection by the database stops the pipeline, naming the epoch, table and constraint.

Real Postgres (both write modes, and through SQLAlchemy) and a real SQLite
file: the sinks turn the server's refusal into a RejectedError, and ``drive``
stops at it without a retry or a new writer generation, with nothing of the
epoch in the sink: no row, no marker.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from reconcile import CommitCycle, drive
from reconcile.core.contract import (
    OK,
    Fatal,
    InvalidInputError,
    RejectedError,
    RowsRejectedError,
    SinkOutcome,
    SinkTxnId,
)
from reconcile.core.decisions import Failure, classify, is_terminal
from reconcile.core.metrics import InMemoryMetrics
from reconcile.engine.driver import RetryPolicy
from reconcile.engine.progress_file import FileProgressLog
from sinks.postgres.factory import postgres_sink
from sinks.sql.sink import SqlSink
from tests.fix_pg import PgServer, markers_table

pytestmark = pytest.mark.integration

PIPE = "shop"
FAST = RetryPolicy(give_up_after_s=5.0, initial_s=0.0, max_s=0.0, jitter_s=0.0)
DDL = (
    "CREATE TABLE shop_lines (id bigint PRIMARY KEY, qty int NOT NULL, _epoch bigint, "
    "CONSTRAINT qty_positive CHECK (qty > 0))"
)


def one_epoch(sink: Any, rows: list[dict[str, Any]], epoch: int) -> SinkOutcome:
    txn = SinkTxnId(PIPE, sink.name, epoch, 0)
    assert sink.stage(txn, rows) == OK
    outcome: SinkOutcome = sink.prepare(txn)
    return outcome if outcome != OK else sink.commit(txn)


def rejected_by(outcome: SinkOutcome) -> RejectedError:
    assert isinstance(outcome, Fatal), outcome
    assert isinstance(outcome.error, RejectedError), outcome
    return outcome.error


@pytest.mark.parametrize("mode", ["transactional", "prepared"])
def test_the_postgres_sink_names_the_constraint_the_column_and_the_value(
    pg_db: str, mode: str
) -> None:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute(DDL)
    sink = postgres_sink(pg_db, "shop_lines", name="lines", pipeline=PIPE, mode=mode)
    try:
        assert one_epoch(sink, [{"id": 1, "qty": 3}], 0) == OK
        # Several columns at once: a good row beside the bad one changes nothing.
        check = rejected_by(one_epoch(sink, [{"id": 2, "qty": 5}, {"id": 3, "qty": -1}], 1))
        assert (check.epoch, check.sqlstate, check.details["constraint"]) == (
            1, "23514", "qty_positive")  # fmt: skip
        assert check.table == "public.shop_lines" and check.details["sink"] == "lines"
        assert "Failing row" not in str(check)  # the row's values stay in the log's DETAIL
        # A NOT NULL the server checks (a column the sink does not send): the column named.
        with psycopg.connect(pg_db, autocommit=True) as conn:
            conn.execute("ALTER TABLE shop_lines ADD COLUMN note text NOT NULL DEFAULT ''")
            conn.execute("ALTER TABLE shop_lines ALTER COLUMN note DROP DEFAULT")
        absent = rejected_by(one_epoch(sink, [{"id": 6, "qty": 1}], 4))
        assert (absent.sqlstate, absent.details["column"]) == ("23502", "note")
        assert "column note" in str(absent)
        with psycopg.connect(pg_db, autocommit=True) as conn:
            conn.execute("ALTER TABLE shop_lines DROP COLUMN note")
        # A NULL the sink sees itself is refused before anything is sent: a
        # rejection all the same (the column and the SQLSTATE the server
        # would give), and bad input, typed: it stops the pipeline, never retried.
        null = rejected_by(one_epoch(sink, [{"id": 4, "qty": None}], 2))
        assert isinstance(null, RowsRejectedError) and isinstance(null, InvalidInputError)
        assert (null.epoch, null.sqlstate, null.details["column"]) == (2, "23502", "qty")
        assert is_terminal(null) and "column 'qty'" in str(null)
        # A data exception the server raises (22012, in a generated column).
        with psycopg.connect(pg_db, autocommit=True) as conn:
            conn.execute(
                "ALTER TABLE shop_lines DROP CONSTRAINT qty_positive, "
                "ADD COLUMN per numeric GENERATED ALWAYS AS (100 / qty) STORED"
            )
        zero = rejected_by(one_epoch(sink, [{"id": 5, "qty": 0}], 3))
        assert zero.sqlstate == "22012" and "epoch 3" in str(zero)
        assert "division by zero" in str(zero)
    finally:
        sink.close()
    with psycopg.connect(pg_db, autocommit=True) as conn:
        assert conn.execute("SELECT id FROM shop_lines").fetchall() == [(1,)]
        table = markers_table(conn)
        assert table is not None
        epochs = conn.execute(sql.SQL("SELECT epoch FROM {}").format(table)).fetchall()
    assert epochs == [(0,)]


# Who refuses epoch 1's row (its qty), and what the rejection names.
REFUSED_BY = {
    "database": (-1, {"constraint": "qty_positive", "sqlstate": "23514"}),
    "engine": (None, {"column": "qty", "sqlstate": "23502"}),  # NOT NULL, checked before sending
}


@pytest.mark.parametrize("refused_by", sorted(REFUSED_BY))
def test_drive_stops_at_a_rejected_epoch_with_nothing_of_it_written(
    pg_db: str, tmp_path: Path, refused_by: str
) -> None:
    bad, named = REFUSED_BY[refused_by]
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute(DDL)
    log = FileProgressLog(tmp_path / "progress", PIPE)
    builds: list[int] = []
    metrics = InMemoryMetrics()

    def build() -> CommitCycle:
        builds.append(1)
        return CommitCycle(PIPE, [postgres_sink(pg_db, "shop_lines", name="lines")], log,
                           metrics=metrics)  # fmt: skip

    def outputs(epoch: int) -> dict[str, list[dict[str, Any]]]:
        return {"lines": [{"id": epoch, "qty": bad if epoch == 1 else epoch + 1}]}

    with pytest.raises(RejectedError) as stopped:
        drive(build, range(4), outputs, retry=FAST)
    assert stopped.value.epoch == 1 and classify(stopped.value) is Failure.REJECTED
    assert {k: stopped.value.details[k] for k in named} == named
    assert builds == [1]  # no restart
    # The one metric of a rejection, whoever found it.
    sqlstate = named["sqlstate"]
    assert metrics.value("pipeline.rejected", sink="lines", sqlstate=sqlstate) == 1
    assert FileProgressLog(tmp_path / "progress", PIPE).claim_generation() == 2
    with psycopg.connect(pg_db, autocommit=True) as conn:
        assert conn.execute("SELECT id FROM shop_lines").fetchall() == [(0,)]
        table = markers_table(conn)
        assert table is not None
        epochs = conn.execute(sql.SQL("SELECT epoch FROM {}").format(table)).fetchall()
    assert epochs == [(0,)]


def test_the_sql_sink_maps_integrity_and_data_errors(pg_server: PgServer, tmp_path: Path) -> None:
    name = pg_server.create_database("rej")
    try:
        with pg_server.connect(name) as conn:
            conn.execute(DDL)
        url = f"postgresql+psycopg://postgres@127.0.0.1:{pg_server.port}/{name}"
        sink = SqlSink(url, "shop_lines", name="lines")
        try:
            assert one_epoch(sink, [{"id": 1, "qty": 3}], 0) == OK
            check = rejected_by(one_epoch(sink, [{"id": 2, "qty": -4}], 1))
            assert (check.epoch, check.sqlstate, check.details["constraint"]) == (
                1, "23514", "qty_positive")  # fmt: skip
            assert "table shop_lines, constraint qty_positive" in str(check)
        finally:
            sink.close()
    finally:
        pg_server.drop_database(name)
    # SQLite: no SQLSTATE, but an IntegrityError all the same.
    lite = SqlSink(f"sqlite:///{tmp_path / 'lite.db'}", "shop_lines", name="lines")
    with lite.engine.begin() as conn:
        conn.exec_driver_sql(DDL.replace("bigint", "INTEGER").replace("int ", "INTEGER "))
    try:
        refused = rejected_by(one_epoch(lite, [{"id": 1, "qty": 0}], 0))
        assert refused.epoch == 0 and refused.table == "shop_lines" and refused.sqlstate == ""
    finally:
        lite.close()


def test_a_repair_the_database_refuses_is_a_rejection_not_a_retry(
    pg_db: str, tmp_path: Path
) -> None:
    # A repair refused by a constraint is refused by every retry: a takeover
    # that recovers its sinks must stop there, not step down and take over again.
    import pyarrow as pa

    from expected_state.store import ExpectedStateStore
    from reconcile import recover
    from reconcile.core.contract import Change

    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE shop_lines (id bigint PRIMARY KEY, qty int NOT NULL, _epoch bigint)"
        )
    rows = [{"id": 1, "qty": 3}, {"id": 2, "qty": -1}]
    schema = pa.schema([("id", pa.int64()), ("qty", pa.int32())])
    store = ExpectedStateStore(str(tmp_path / "state"), PIPE, "shop_lines", ["id"], schema=schema)
    store.apply(0, [Change("upsert", r) for r in rows])
    cycle = CommitCycle(PIPE, [postgres_sink(pg_db, "shop_lines", name="shop_lines")],
                        str(tmp_path / "progress"))  # fmt: skip
    cycle.start()
    assert cycle.run_epoch(0, {"shop_lines": rows}).epoch == 0
    cycle.close()
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("ALTER TABLE shop_lines ADD CONSTRAINT qty_positive CHECK (qty > 0) NOT VALID")
        conn.execute("DELETE FROM shop_lines WHERE id = 2")
    with pytest.raises(RejectedError) as err:
        recover(pg_db, str(tmp_path / "state"), PIPE, "shop_lines", mode="full")
    assert is_terminal(err.value)
    assert err.value.details["constraint"] == "qty_positive" and err.value.epoch == 0
    assert "public.shop_lines" in str(err.value)
    with psycopg.connect(pg_db) as conn:  # nothing of the repair was written
        assert conn.execute("SELECT id FROM shop_lines").fetchall() == [(1,)]
