"""Someone else changes a Postgres sink's table: the write path names it, and verify agrees.

Each change is made by another session with plain DDL, either while the
pipeline runs (between two epochs of one cycle) or while it is stopped
(before a restart). What the write path does, checked in the catalog, the
rows and the store's Delta version, must agree with what ``verify`` says of
the same table: never written and then refused by every verify.

- a value column dropped: the epoch (or the restart) stops naming it, and it
  is never added back with every row NULL; verify refuses the table too;
- a column the store added in an epoch the sink holds, dropped: the same;
- a column the pipeline does not write, added nullable (``jsonb`` here): left
  alone by the epochs, by verify and by a repair, its values kept;
- the same column brought by the pipeline later: refused at the write path,
  naming it (verify could not compare ``xml`` with the store's string);
- an empty column of a type verify reads, made ahead by a DBA: taken over;
  with values someone else wrote: refused;
- a column the pipeline writes retyped: the epoch stops naming it, and a
  restart refuses what verify would refuse;
- a NOT NULL column without a default added: the server refuses the insert,
  naming it, and so does the sink after a restart.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest
from deltalake import DeltaTable

from reconcile import CommitCycle, CommitSucceeded
from reconcile.core.contract import InvalidInputError
from reconcile.core.results import CommitFatal
from reconcile.core.schema_change import ForeignSchemaChange
from reconcile.engine.expected import ExpectedState
from reconcile.recovery import recover
from sinks.postgres.factory import postgres_sink

pytestmark = pytest.mark.integration

DDL = "CREATE TABLE orders (id bigint PRIMARY KEY, qty integer, name varchar(10), _epoch bigint)"


def _ddl(dsn: str, *statements: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


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


def _cycle(dsn: str, root: Path) -> CommitCycle:
    expected = ExpectedState(str(root), "shop", {"orders": ["id"]})
    cycle = CommitCycle("shop", [postgres_sink(dsn, "orders", name="orders")],
                        expected_state=expected)  # fmt: skip
    cycle.start()
    return cycle


def _row(i: int, **extra: Any) -> dict[str, Any]:
    return {"id": i, "qty": i, "name": f"n{i}", **extra}


def _store_version(root: Path) -> int:
    return DeltaTable(str(root / "shop" / "orders")).version()


def _verify(dsn: str, root: Path) -> tuple[int, int, int]:
    report = recover(dsn, str(root), "shop", "orders", mode="full", dry_run=True)
    return report.missing, report.extra, report.changed


@pytest.fixture
def dsn(pg_db: str) -> str:
    _ddl(pg_db, DDL)
    return pg_db


@pytest.fixture
def running(dsn: str, tmp_path: Path) -> CommitCycle:
    """A cycle that committed epoch 0 (rows 1 and 2), still open."""
    cycle = _cycle(dsn, tmp_path / "store")
    assert isinstance(cycle.run_epoch(0, {"orders": [_row(1), _row(2)]}), CommitSucceeded)
    return cycle


def _stops(cycle: CommitCycle, dsn: str, root: Path, rows: list[dict[str, Any]]) -> str:
    """Run epoch 1 expecting a stop; nothing written in the sink or the store."""
    before, version = _rows(dsn), _store_version(root)
    result = cycle.run_epoch(1, {"orders": rows})
    cycle.close()
    assert isinstance(result, CommitFatal), result
    assert _rows(dsn) == before and _store_version(root) == version
    return result.reason


def _refused_at_start(dsn: str, root: Path, change: str) -> ForeignSchemaChange:
    columns = _columns(dsn)
    with pytest.raises(ForeignSchemaChange) as refused:
        _cycle(dsn, root)
    assert refused.value.details["change"] == change
    assert _columns(dsn) == columns, "the restart changed the table"
    return refused.value


@pytest.mark.parametrize("when", ["running", "stopped"])
def test_a_value_column_someone_dropped_is_named_and_never_added_back_as_nulls(
    dsn: str, tmp_path: Path, running: CommitCycle, when: str
) -> None:
    root = tmp_path / "store"
    if when == "stopped":
        running.close()
    _ddl(dsn, "ALTER TABLE orders DROP COLUMN qty")
    if when == "running":
        reason = _stops(running, dsn, root, [_row(3)])
        assert "table public.orders: column 'qty' was dropped by someone else" in reason
    refused = _refused_at_start(dsn, root, "dropped")
    assert refused.details["column"] == "qty" and "someone dropped it" in str(refused)
    assert "qty" not in _columns(dsn)
    # verify refuses the same table: the write path and verify agree.
    with pytest.raises(InvalidInputError, match="'qty'"):
        _verify(dsn, root)


def test_a_column_an_epoch_added_then_someone_dropped_is_not_added_back(
    dsn: str, tmp_path: Path, running: CommitCycle
) -> None:
    """The store added 'note' in epoch 1, which the sink holds: its loss is someone's drop."""
    root = tmp_path / "store"
    assert isinstance(running.run_epoch(1, {"orders": [_row(3, note="x")]}), CommitSucceeded)
    running.close()
    _ddl(dsn, "ALTER TABLE orders DROP COLUMN note")
    refused = _refused_at_start(dsn, root, "dropped")
    assert refused.details["column"] == "note"
    assert "holds epoch 1 and epoch 1 added the column" in str(refused)
    assert "note" not in _columns(dsn)


@pytest.mark.parametrize("when", ["running", "stopped"])
def test_a_nullable_column_the_pipeline_does_not_write_is_left_alone(
    dsn: str, tmp_path: Path, running: CommitCycle, when: str
) -> None:
    root = tmp_path / "store"
    _ddl(dsn, "ALTER TABLE orders ADD COLUMN meta jsonb",
         """UPDATE orders SET meta = '{"by": "someone"}' WHERE id = 2""")  # fmt: skip
    cycle = running
    if when == "stopped":
        running.close()
        cycle = _cycle(dsn, root)
    result = cycle.run_epoch(1, {"orders": [_row(2, qty=20), _row(3)]})
    cycle.close()
    assert isinstance(result, CommitSucceeded), result
    assert [(r[0], r[1], r[-1]) for r in _rows(dsn)] == [
        (1, 1, None),
        (2, 20, {"by": "someone"}),  # the update left it as it was
        (3, 3, None),
    ]
    assert _verify(dsn, root) == (0, 0, 0)
    # A repair of a drifted row leaves it alone too.
    _ddl(dsn, "UPDATE orders SET qty = 99 WHERE id = 2")
    report = recover(dsn, str(root), "shop", "orders", mode="full", allow_mass_change=True)
    assert report.changed == 1 and report.applied == 1
    assert _rows(dsn)[1][1] == 20 and _rows(dsn)[1][-1] == {"by": "someone"}


@pytest.mark.parametrize("when", ["running", "stopped"])
def test_an_xml_column_someone_added_is_refused_when_the_pipeline_brings_it(
    dsn: str, tmp_path: Path, running: CommitCycle, when: str
) -> None:
    """Taken over, it would be refused by every verify (xml against the store's string)."""
    root = tmp_path / "store"
    _ddl(dsn, "ALTER TABLE orders ADD COLUMN meta xml")
    cycle = running
    if when == "stopped":
        running.close()
        cycle = _cycle(dsn, root)
    reason = _stops(cycle, dsn, root, [_row(3, meta="<a>1</a>")])
    if when == "running":
        assert "table public.orders: column 'meta'" in reason
        assert "as xml" in reason and "someone else added it" in reason
    else:  # the sink's types now name it: the store refuses it before anything is sent
        assert "column 'meta' is xml (no type the row hash takes)" in reason
    assert _columns(dsn)["meta"] == "xml"
    assert _verify(dsn, root) == (0, 0, 0)  # the store never took 'meta'


def test_an_empty_column_a_dba_made_ahead_is_taken_over(
    dsn: str, tmp_path: Path, running: CommitCycle
) -> None:
    """Beside a column the sink adds itself, in one epoch; the next epoch writes both."""
    root = tmp_path / "store"
    _ddl(dsn, "ALTER TABLE orders ADD COLUMN note text")
    result = running.run_epoch(1, {"orders": [_row(3, note="x", score=1.5)]})
    assert isinstance(result, CommitSucceeded), result
    assert _columns(dsn)["score"] == "double precision"
    # The next epoch: both columns the pipeline's now, with the values it wrote.
    result = running.run_epoch(2, {"orders": [_row(4, note="y", score=2.5)]})
    running.close()
    assert isinstance(result, CommitSucceeded), result
    assert [r[-2:] for r in _rows(dsn)] == [(None, None), (None, None), ("x", 1.5), ("y", 2.5)]
    assert _verify(dsn, root) == (0, 0, 0)


def test_a_column_someone_filled_is_not_taken_over(
    dsn: str, tmp_path: Path, running: CommitCycle
) -> None:
    root = tmp_path / "store"
    _ddl(dsn, "ALTER TABLE orders ADD COLUMN note text", "UPDATE orders SET note = 'theirs'")
    reason = _stops(running, dsn, root, [_row(3, note="x")])
    assert "column 'note'" in reason and "holds values someone else wrote" in reason
    assert "note" not in ExpectedState(str(root), "shop", {"orders": ["id"]}).tables[
        "orders"
    ].current_schema().names  # fmt: skip
    assert _verify(dsn, root) == (0, 0, 0)


def test_a_column_retyped_while_the_pipeline_runs_stops_the_epoch(
    dsn: str, tmp_path: Path, running: CommitCycle
) -> None:
    """integer -> text would take the epoch's integers, and verify would refuse the table."""
    root = tmp_path / "store"
    _ddl(dsn, "ALTER TABLE orders ALTER COLUMN qty TYPE text")
    reason = _stops(running, dsn, root, [_row(3)])
    assert "column 'qty' was changed by someone else from integer to text" in reason
    # The restart refuses it too (the store's int32 cannot hold text), as verify does.
    with pytest.raises(Exception, match="'qty'"):
        _cycle(dsn, root)
    with pytest.raises(InvalidInputError, match="'qty'"):
        _verify(dsn, root)


def test_a_column_retyped_to_one_verify_cannot_compare_is_refused_at_start(
    dsn: str, tmp_path: Path, running: CommitCycle
) -> None:
    """varchar -> xml: the sink's types leave xml out, so only verify's rule sees it."""
    root = tmp_path / "store"
    running.close()
    _ddl(dsn, "ALTER TABLE orders ALTER COLUMN name TYPE xml USING name::xml")
    refused = _refused_at_start(dsn, root, "retyped")
    assert refused.details["column"] == "name" and "xml in the sink's table" in str(refused)
    with pytest.raises(InvalidInputError, match="'name' is xml in the sink"):
        _verify(dsn, root)


def test_a_not_null_column_someone_added_is_refused_by_the_server_naming_it(
    dsn: str, tmp_path: Path, running: CommitCycle
) -> None:
    """An insert without its value: the database's rejection names the column."""
    root = tmp_path / "store"
    _ddl(dsn, "ALTER TABLE orders ADD COLUMN region text NOT NULL DEFAULT 'eu'",
         "ALTER TABLE orders ALTER COLUMN region DROP DEFAULT")  # fmt: skip
    reason = _stops(running, dsn, root, [_row(3)])
    assert "[23502]" in reason and "region" in reason
    # A restart refuses the epoch before it is sent (the sink reads the column then).
    cycle = _cycle(dsn, root)
    reason = _stops(cycle, dsn, root, [_row(3)])
    assert "NOT NULL column missing from the upserted rows" in reason and "region" in reason
    assert _verify(dsn, root) == (0, 0, 0)  # verify does not compare it: it agrees
