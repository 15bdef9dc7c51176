"""The pieces Spark executors use to write an epoch without the driver, without Spark.

- the store: an epoch written as several change files (``PartWriter``) and added
  in one tokened commit (``apply_parts``) reads, replays, reverts and compacts
  like an epoch ``apply`` wrote, and a file of another schema is refused;
- the Postgres sink: rows COPied into the staging table by several task
  attempts, of which the epoch takes only the kept ones, in its own txn with
  its marker; a staging table that lost rows stops the epoch, with nothing
  applied anywhere.

Each test reads the external system's own state: the Delta log and files, the
rows and markers in Postgres.
"""

from __future__ import annotations

from pathlib import Path

import psycopg
import pyarrow as pa
import pytest
from deltalake import DeltaTable

from expected_state.delta_files import write_data_file
from expected_state.layout import change_file_name
from expected_state.store import ExpectedStateStore
from reconcile import CommitCycle
from reconcile.core.contract import InvalidInputError
from reconcile.core.results import CommitFatal, CommitSucceeded
from reconcile.core.staged import StagedEpoch
from reconcile.engine.expected import ExpectedState
from sinks.postgres.factory import postgres_sink
from sinks.postgres.shared_stage import copy_to_stage, ensure_stage, reflect_target

pytestmark = [pytest.mark.integration]

USER = pa.schema([("id", pa.int64()), ("v", pa.string())])


def rows(ids: range, tag: str) -> pa.Table:
    return pa.table({"id": list(ids), "v": [f"{tag}{i}" for i in ids]}, schema=USER)


def write_parts(store: ExpectedStateStore, epoch: int, *parts: pa.Table) -> list[str]:
    writer = store.part_writer(USER)
    paths = [writer.write(epoch, writer.net(p)) for p in parts]
    return [p for p in paths if p is not None]


def live_parts(store: ExpectedStateStore, epoch: int) -> int:
    names = [Path(u).name for u in DeltaTable(store.uri).file_uris()]
    return sum(1 for n in names if n.startswith(f"change-e{epoch:012d}-"))


def as_dict(table: pa.Table) -> dict[int, str]:
    return dict(zip(table.column("id").to_pylist(), table.column("v").to_pylist(), strict=True))


def test_an_epoch_in_parts_reads_replays_reverts_and_compacts_as_one(tmp_path: Path) -> None:
    store = ExpectedStateStore(str(tmp_path), "p", "t", ["id"])
    first = write_parts(store, 0, rows(range(0, 5), "a"), rows(range(5, 10), "a"))
    assert store.apply_parts(0, first, upserted=10, deleted=0).applied
    second = write_parts(store, 1, rows(range(3, 6), "b"), rows(range(10, 12), "b"))
    result = store.apply_parts(1, second, upserted=5, deleted=0)
    assert result.applied and live_parts(store, 1) == 2  # one commit, both files
    model = {i: "a" + str(i) for i in range(10)} | {i: "b" + str(i) for i in (3, 4, 5, 10, 11)}
    assert as_dict(store.snapshot()) == model
    assert sorted(store.changes_of(1).column("id").to_pylist()) == [3, 4, 5, 10, 11]
    # A replay (Spark re-runs the batch) adds nothing, whatever files it names.
    again = write_parts(store, 1, rows(range(0, 12), "c"))
    assert not store.apply_parts(1, again, upserted=12, deleted=0).applied
    assert as_dict(store.snapshot()) == model
    # Revert takes every part of the epoch out, in one commit.
    assert store.revert(1)
    assert live_parts(store, 1) == 0
    assert as_dict(store.snapshot()) == {i: "a" + str(i) for i in range(10)}
    store.apply_parts(1, second, upserted=5, deleted=0)
    # Folded into the base, the epoch's keys are still found by the log's list.
    third = write_parts(store, 2, rows(range(20, 21), "d"))
    store.apply_parts(2, third, upserted=1, deleted=0)
    store.compact(through_epoch=1)
    assert live_parts(store, 1) == 0  # folded
    fresh = ExpectedStateStore(str(tmp_path), "p", "t", ["id"])
    assert sorted(fresh.changed_keys(0).column("id").to_pylist()) == [3, 4, 5, 10, 11, 20]
    assert as_dict(fresh.snapshot()) == model | {20: "d20"}


def test_a_part_of_another_schema_is_refused_and_nothing_is_added(tmp_path: Path) -> None:
    store = ExpectedStateStore(str(tmp_path), "p", "t", ["id"])
    good = write_parts(store, 0, rows(range(3), "a"))
    wrong = pa.table(
        {"id": [7], "v": [1], "_row_hash": [0], "_epoch": [0], "_op": ["upsert"]}
    )  # v is an integer here
    bad = write_data_file(store.uri, change_file_name(0), wrong).path
    with pytest.raises(InvalidInputError, match="'v'"):
        store.apply_parts(0, [*good, bad], upserted=4, deleted=0)
    assert store.last_epoch() is None and live_parts(store, 0) == 0


TABLE = "CREATE TABLE items (id bigint PRIMARY KEY, v text NOT NULL, _epoch bigint)"


def staged_epoch(dsn: str, store: ExpectedStateStore, epoch: int, *attempts: tuple[str, pa.Table],
                 keep: tuple[str, ...]) -> StagedEpoch:  # fmt: skip
    """COPY every attempt's rows into the staging table; the epoch keeps ``keep``."""
    client = postgres_sink(dsn, "items", name="items")
    stage = ensure_stage(client, reflect_target(client), "p")
    writer = store.part_writer(USER)
    files: list[str] = []
    for task, table in attempts:
        copy_to_stage(client.target, stage, epoch, task, table)
        if task in keep:
            files.append(writer.write(epoch, writer.net(table)) or "")
    kept = sum(t.num_rows for task, t in attempts if task in keep)
    return StagedEpoch("items", epoch, ("id", "v"), stage, keep, kept, tuple(files), kept, 0)


def cycle(dsn: str, root: Path) -> CommitCycle:
    expected = ExpectedState(str(root), "p", {"items": ["id"]})
    built = CommitCycle("p", [postgres_sink(dsn, "items", name="items")], expected_state=expected)
    built.start()
    return built


def target(dsn: str) -> set[tuple[int, str, int]]:
    with psycopg.connect(dsn) as conn:
        return set(conn.execute("SELECT id, v, _epoch FROM items").fetchall())


def markers(dsn: str) -> list[int]:
    with psycopg.connect(dsn) as conn:
        found = conn.execute("SELECT epoch FROM reconcile.reconcile_commits ORDER BY epoch")
        return [int(r[0]) for r in found.fetchall()]


@pytest.mark.parametrize("mode", ["transactional", "prepared"])
def test_the_epoch_takes_the_kept_attempts_rows_from_the_staging_table(
    pg_db: str, tmp_path: Path, mode: str
) -> None:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute(TABLE)
    expected = ExpectedState(str(tmp_path), "p", {"items": ["id"]})
    run = CommitCycle(
        "p", [postgres_sink(pg_db, "items", name="items", mode=mode)], expected_state=expected
    )
    run.start()
    store = expected.tables["items"]
    staged = staged_epoch(
        pg_db,
        store,
        0,
        ("kept-1", rows(range(0, 4), "x")),
        ("dead", rows(range(2, 6), "dead")),  # an attempt Spark did not keep
        ("kept-2", rows(range(4, 6), "x")),
        keep=("kept-1", "kept-2"),
    )
    assert isinstance(run.run_epoch(0, {"items": staged}), CommitSucceeded)
    assert target(pg_db) == {(i, f"x{i}", 0) for i in range(6)}
    assert markers(pg_db) == [0]
    assert as_dict(store.snapshot()) == {i: f"x{i}" for i in range(6)}
    run.close()


def test_a_staging_table_that_lost_rows_stops_the_epoch_with_nothing_applied(
    pg_db: str, tmp_path: Path
) -> None:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute(TABLE)
    run = cycle(pg_db, tmp_path)
    store = run.expected_state.tables["items"]  # type: ignore[union-attr]
    staged = staged_epoch(pg_db, store, 0, ("t1", rows(range(0, 5), "x")), keep=("t1",))
    with psycopg.connect(pg_db, autocommit=True) as conn:
        schema, table = staged.stage
        # Rows gone from under the epoch (a zombie writer's sweep, a crash).
        conn.execute(f'DELETE FROM "{schema}"."{table}" WHERE id = 3')
    result = run.run_epoch(0, {"items": staged})
    assert isinstance(result, CommitFatal) and "holds 4 rows" in result.reason
    assert target(pg_db) == set() and markers(pg_db) == []
    assert store.last_epoch() is None  # decided never: nothing recorded either
    run.close()
