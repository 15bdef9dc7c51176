"""Schema evolution at its edges, on a real Postgres and a real store.

- an evolving epoch aborted (its prepare failed) leaves the store's schema and
  the sink's table as they were: the epoch run again without the column adds
  nothing anywhere; run again with it, it adds the column once;
- a ``varchar(n)`` widened to ``varchar(m)`` takes values of exactly m
  characters in the very epoch that widens it, and refuses m + 1;
- a column the store committed and the sink lacks (a crash between the two),
  handed to the sink at the restart, survives an abort of the epoch that
  brings it (no epoch run again would hand it again), and is made beside a
  new column that epoch brings;
- two evolving epochs in a row of one writer: the second checks its rows
  against the table as the first left it.

Each assertion reads the catalog, the rows and the Delta table, not the
engine's bookkeeping.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
import pytest
from deltalake import DeltaTable

from expected_state.evolving import SCHEMA_COMMITTED
from reconcile import CommitCycle, CommitSucceeded
from reconcile.core import hooks
from reconcile.core.results import CommitAborted, CommitFatal
from reconcile.engine.expected import ExpectedState
from reconcile.engine.faults import Fault, FaultKind, FaultPlan
from reconcile.recovery import recover
from sinks.postgres.factory import postgres_sink

pytestmark = pytest.mark.integration

DDL = "CREATE TABLE orders (id bigint PRIMARY KEY, qty integer, name varchar(10), _epoch bigint)"


def _columns(dsn: str) -> dict[str, str]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
            "WHERE attrelid = 'orders'::regclass AND attnum > 0 AND NOT attisdropped "
            "ORDER BY attnum"
        ).fetchall()
    return {str(r[0]): str(r[1]) for r in rows}


def _rows(dsn: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT * FROM orders ORDER BY id").fetchall()


def _row(i: int, **extra: Any) -> dict[str, Any]:
    return {"id": i, "qty": i, "name": f"n{i}", **extra}


def _delta(root: Path) -> DeltaTable:
    return DeltaTable(str(root / "shop" / "orders"))


def _cycle(dsn: str, root: Path, mode: str = "transactional", **kw: Any) -> CommitCycle:
    schemas = kw.pop("schemas", None)
    expected = ExpectedState(str(root), "shop", {"orders": ["id"]}, schemas=schemas)
    sink = postgres_sink(dsn, "orders", name="orders", mode=mode)
    cycle = CommitCycle("shop", [sink], expected_state=expected, **kw)
    cycle.start()
    return cycle


@pytest.fixture
def dsn(pg_db: str) -> str:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute(DDL)
    return pg_db


@pytest.mark.parametrize("again", ["without", "with"])
def test_an_aborted_evolving_epoch_leaves_the_store_and_the_sink_as_they_were(
    dsn: str, tmp_path: Path, again: str
) -> None:
    root = tmp_path / "store"
    plan = FaultPlan([Fault("cycle.prepare", FaultKind.RETRYABLE, nth=2)])
    cycle = _cycle(dsn, root, faults=plan)
    assert isinstance(cycle.run_epoch(0, {"orders": [_row(1)]}), CommitSucceeded)
    version = _delta(root).version()
    result = cycle.run_epoch(1, {"orders": [_row(2, note="x")]})
    assert isinstance(result, CommitAborted) and plan.all_fired, result
    assert "note" not in _delta(root).schema().to_arrow().names
    assert _delta(root).version() == version and "note" not in _columns(dsn)
    # Run again: without the column (the transform changed back), nothing is
    # added anywhere; with it, the column is added once, in both.
    rows = [_row(2)] if again == "without" else [_row(2, note="x")]
    result = cycle.run_epoch(1, {"orders": rows})
    cycle.close()
    assert isinstance(result, CommitSucceeded), result
    added = again == "with"
    assert ("note" in _columns(dsn)) is added
    assert ("note" in _delta(root).schema().to_arrow().names) is added
    assert [r[0] for r in _rows(dsn)] == [1, 2]
    report = recover(dsn, str(root), "shop", "orders", mode="full", dry_run=True)
    assert (report.missing, report.extra, report.changed) == (0, 0, 0)


def _names(length: int | None) -> pa.Schema:
    name = pa.field("name", pa.string(), metadata={"sql_type": f"varchar({length})"})
    return pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("qty", pa.int32()),
                      name])  # fmt: skip


@pytest.mark.parametrize("mode", ["transactional", "prepared"])
def test_a_widened_varchar_takes_values_of_its_new_length_in_the_epoch_that_widens_it(
    dsn: str, tmp_path: Path, mode: str
) -> None:
    root = tmp_path / "store"
    cycle = _cycle(dsn, root, mode)
    assert isinstance(cycle.run_epoch(0, {"orders": [_row(1)]}), CommitSucceeded)
    cycle.close()
    cycle = _cycle(dsn, root, mode, schemas={"orders": _names(40)})
    exactly = "x" * 40
    result = cycle.run_epoch(1, {"orders": [_row(2, name=exactly)]})
    assert isinstance(result, CommitSucceeded), result
    assert _columns(dsn)["name"] == "character varying(40)"
    # One more than the new length is refused, naming the column; nothing written.
    result = cycle.run_epoch(2, {"orders": [_row(3, name=exactly + "x")]})
    cycle.close()
    assert isinstance(result, CommitFatal) and "'name'" in result.reason, result
    assert [(r[0], r[2]) for r in _rows(dsn)] == [(1, "n1"), (2, exactly)]


class _Crash(BaseException):
    """The process "dies" here."""


def _crash() -> None:
    raise _Crash


def test_a_column_the_store_committed_survives_an_aborted_first_epoch_after_a_restart(
    dsn: str, tmp_path: Path
) -> None:
    """Handed to the sink at start (the store has it, the sink not), it is no epoch's to drop."""
    root = tmp_path / "store"
    cycle = _cycle(dsn, root)
    assert isinstance(cycle.run_epoch(0, {"orders": [_row(1)]}), CommitSucceeded)
    with hooks.at(SCHEMA_COMMITTED, _crash), pytest.raises(_Crash):
        cycle.run_epoch(1, {"orders": [_row(2, note="x")]})
    cycle.close()
    assert "note" in _delta(root).schema().to_arrow().names and "note" not in _columns(dsn)
    plan = FaultPlan([Fault("cycle.prepare", FaultKind.RETRYABLE)])
    cycle = _cycle(dsn, root, faults=plan)
    result = cycle.run_epoch(1, {"orders": [_row(2, note="x")]})
    assert isinstance(result, CommitAborted) and plan.all_fired, result
    result = cycle.run_epoch(1, {"orders": [_row(2, note="x")]})
    cycle.close()
    assert isinstance(result, CommitSucceeded), result
    assert [(r[0], r[-1]) for r in _rows(dsn)] == [(1, None), (2, "x")]
    report = recover(dsn, str(root), "shop", "orders", mode="full", dry_run=True)
    assert (report.missing, report.extra, report.changed) == (0, 0, 0)


@pytest.mark.parametrize("mode", ["transactional", "prepared"])
def test_two_evolving_epochs_in_a_row_of_one_writer_each_add_their_column(
    dsn: str, tmp_path: Path, mode: str
) -> None:
    """The second change comes while the sink still keeps the first (its txn not yet seen done)."""
    root = tmp_path / "store"
    cycle = _cycle(dsn, root, mode)
    assert isinstance(cycle.run_epoch(0, {"orders": [_row(1)]}), CommitSucceeded)
    assert isinstance(cycle.run_epoch(1, {"orders": [_row(2, note="a")]}), CommitSucceeded)
    result = cycle.run_epoch(2, {"orders": [_row(3, note="b", score=1.5)]})
    assert isinstance(result, CommitSucceeded), result
    result = cycle.run_epoch(3, {"orders": [_row(4, note="c", score=2.5)]})
    cycle.close()
    assert isinstance(result, CommitSucceeded), result
    assert list(_columns(dsn))[-2:] == ["note", "score"]
    assert [r[-2:] for r in _rows(dsn)] == [(None, None), ("a", None), ("b", 1.5), ("c", 2.5)]
    assert {"note", "score"} <= set(_delta(root).schema().to_arrow().names)
    # Every mode reads the epochs before each column and after it alike (the
    # store's older files with the column NULL, the sink's older rows too), and
    # finds the one row changed by hand since.
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE orders SET score = 9 WHERE id = 3")
    for verify_mode in ("full", "scoped", "buckets"):
        report = recover(dsn, str(root), "shop", "orders", mode=verify_mode, dry_run=True,
                         since_epoch=1)  # fmt: skip
        assert (report.missing, report.extra, report.changed) == (0, 0, 1), verify_mode


def test_a_pending_and_a_new_column_are_both_made_by_the_first_epoch_after_a_restart(
    dsn: str, tmp_path: Path
) -> None:
    """The store committed 'note' (the sink not); the epoch run again brings 'score' too."""
    root = tmp_path / "store"
    cycle = _cycle(dsn, root)
    assert isinstance(cycle.run_epoch(0, {"orders": [_row(1)]}), CommitSucceeded)
    with hooks.at(SCHEMA_COMMITTED, _crash), pytest.raises(_Crash):
        cycle.run_epoch(1, {"orders": [_row(2, note="x")]})
    cycle.close()
    cycle = _cycle(dsn, root)
    result = cycle.run_epoch(1, {"orders": [_row(2, note="x", score=0.5)]})
    cycle.close()
    assert isinstance(result, CommitSucceeded), result
    assert list(_columns(dsn))[-2:] == ["note", "score"]
    assert [r[-2:] for r in _rows(dsn)] == [(None, None), ("x", 0.5)]
    report = recover(dsn, str(root), "shop", "orders", mode="full", dry_run=True)
    assert (report.missing, report.extra, report.changed) == (0, 0, 0)
