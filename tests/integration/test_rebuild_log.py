"""The rebuild log is checked like the store, on a real Delta store and real Postgres.

A rebuild's steps decide which logic may write a pipeline, so the log is
refused, naming what was found, when it cannot be trusted: deleted while a
store table shows the rebuild's rebase, a "switched" step planted by someone
else (a plain Delta append, a forged transaction with a generation the
pipeline never claimed, a file rewritten on disk), a step removed. Nothing
is written by a writer it refuses. And the steps of resuming: a rebuild
killed between two tables' rebases resumes into the new logic in every sink;
one pipeline's unfinished rebuild blocks no other pipeline of the same store.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from expected_state.rebasing import REBASE_WRITTEN
from expected_state.rebuilds import RebuildLog
from reconcile import CommitCycle
from reconcile.core import hooks
from reconcile.core.contract import ConfigurationError, StoreIntegrityError
from reconcile.engine.expected import ExpectedState
from reconcile.rebuild import rebuild
from reconcile.rebuild.run import REBUILD_STARTED, REBUILD_STORED
from sinks.postgres.factory import postgres_sink
from tests.integration.rebuild_pipeline import LOGICS, inputs, outputs, recompute, state

pytestmark = pytest.mark.integration

DDL = "CREATE TABLE {} (id bigint PRIMARY KEY, total bigint, tag text, _epoch bigint)"


class Boom(Exception):
    """The failure a hook point raises, as a crash would stop the rebuild there."""


def build_of(dsn: str, root: str, pipeline: str, tables: Sequence[str],
             logic: str | None = None) -> Callable[[], CommitCycle]:  # fmt: skip
    def make() -> CommitCycle:
        expected = ExpectedState(root, pipeline, {t: ["id"] for t in tables})
        sinks = [postgres_sink(dsn, t, name=t) for t in tables]
        return CommitCycle(pipeline, sinks, expected_state=expected, logic_version=logic)

    return make


def run(build: Callable[[], CommitCycle], tables: Sequence[str], logic: str,
        epochs: Sequence[Sequence[tuple[int, int]]], first: int = 0) -> None:  # fmt: skip
    cycle = build()
    try:
        cycle.start()
        for n, events in enumerate(epochs):
            rows = outputs(LOGICS[logic], events)
            cycle.run_epoch(first + n, {t: rows for t in tables})
    finally:
        cycle.close()


def seeded(dsn: str, root: str, pipeline: str, tables: Sequence[str]) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for t in tables:
            conn.execute(DDL.format(t))
    run(build_of(dsn, root, pipeline, tables, "v1"), tables, "v1", inputs())


def sink(dsn: str, table: str) -> dict[int, tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(f"SELECT id, total, tag FROM {table} ORDER BY id").fetchall()
    return {r[0]: (r[1], r[2]) for r in rows}


def interrupted(dsn: str, root: str, pipeline: str, tables: Sequence[str], point: str,
                nth: int = 1) -> None:  # fmt: skip
    """A rebuild to logic v2 stopped at ``point`` (its nth hit), as a crash there would."""

    def boom() -> None:
        raise Boom(point)

    epochs = inputs()
    with hooks.at(point, boom, nth=nth) as armed, pytest.raises(Boom):
        rebuild(build_of(dsn, root, pipeline, tables), lambda _: recompute(LOGICS["v2"], epochs),
                logic_version="v2", part_rows=4, previous="v1")  # fmt: skip
    assert armed.fired == 1


def refused_start(build: Callable[[], CommitCycle]) -> StoreIntegrityError:
    cycle = build()
    try:
        with pytest.raises(StoreIntegrityError) as refused:
            cycle.start()
    finally:
        cycle.close()
    return refused.value


@pytest.fixture
def shop(pg_db: str, tmp_path: Path) -> tuple[str, str]:
    root = str(tmp_path / "store")
    seeded(pg_db, root, "shop", ["orders"])
    return pg_db, root


def test_a_deleted_rebuild_log_is_refused_naming_the_rebuild(shop: tuple[str, str]) -> None:
    dsn, root = shop
    interrupted(dsn, root, "shop", ["orders"], REBUILD_STORED)  # the store rebased, no sink yet
    rebuilt = RebuildLog(root, "shop").newest()
    assert rebuilt is not None and rebuilt.step == "stored"
    before = sink(dsn, "orders")
    shutil.rmtree(f"{root}/_rebuilds")
    # The old logic, a writer that names none, and a rebuild are all refused:
    # none may take the half-rebuilt pipeline for one that was never rebuilt.
    for logic in ("v1", None):
        error = refused_start(build_of(dsn, root, "shop", ["orders"], logic))
        assert f'rebuild {rebuilt.rebuild} to logic "v2"' in str(error), error
        assert error.details["store_table"] == f"{root}/shop/orders"
        assert "deleted or lost steps" in str(error)
    with pytest.raises(StoreIntegrityError, match=rebuilt.rebuild):
        rebuild(build_of(dsn, root, "shop", ["orders"]),
                lambda _: recompute(LOGICS["v2"], inputs()), logic_version="v2")  # fmt: skip
    assert sink(dsn, "orders") == before  # nothing was written by the refused writers


def test_a_finished_rebuilds_log_deleted_is_refused_too(shop: tuple[str, str]) -> None:
    dsn, root = shop
    rebuild(build_of(dsn, root, "shop", ["orders"]), lambda _: recompute(LOGICS["v2"], inputs()),
            logic_version="v2", previous="v1")  # fmt: skip
    shutil.rmtree(f"{root}/_rebuilds")
    error = refused_start(build_of(dsn, root, "shop", ["orders"], "v1"))
    assert "was rebased by a rebuild the log does not hold" in str(error)


def _row(log: RebuildLog, **changes: Any) -> pa.Table:
    """The newest step's row with ``changes``: what someone else would append."""
    table = DeltaTable(log.uri)
    newest = max(table.to_pyarrow_table().to_pylist(), key=lambda r: r["seq"])
    newest.update(changes)
    return pa.Table.from_pylist([newest], schema=pa.schema(table.schema().to_arrow()))


@pytest.mark.parametrize(
    "how", ["plain-append", "forged-generation", "file-replaced", "file-rewritten", "deleted"]
)
def test_a_step_the_engine_did_not_write_is_refused(shop: tuple[str, str], how: str) -> None:
    dsn, root = shop
    interrupted(dsn, root, "shop", ["orders"], REBUILD_STORED)
    log = RebuildLog(root, "shop")
    stored = log.newest()
    assert stored is not None
    # The step that would let the old logic start: "switched" back to v1.
    switched = {"step": "switched", "logic_version": "v1", "seq": stored.seq + 1}
    if how == "plain-append":
        write_deltalake(log.uri, _row(log, **switched), mode="append")
        named = f"step {stored.seq + 1} 'switched'"
    elif how == "forged-generation":
        # With the engine's own app transaction, but a generation no writer claimed.
        forged = Transaction(app_id="shop#rebuilds", version=stored.seq + 1)
        write_deltalake(log.uri, _row(log, **switched, generation=99), mode="append",
                        commit_properties=CommitProperties(app_transactions=[forged]))  # fmt: skip
        named = "never claimed"
    elif how == "file-replaced":
        # The "stored" step's file replaced on disk by a "switched" one; the log untouched.
        table = DeltaTable(log.uri)
        path = next(p for p in table.file_uris() if f"-{stored.seq:08d}-" in p)
        pq.write_table(_row(log, step="switched", logic_version="v1"), path)
        named = "is not the one its log entry describes"
    elif how == "file-rewritten":
        # Rewritten in place to the byte, the same size: its values against its entry's.
        table = DeltaTable(log.uri)
        path = next(p for p in table.file_uris() if f"-{stored.seq:08d}-" in p)
        data = Path(path).read_bytes()
        Path(path).write_bytes(data.replace(b"v2", b"v1"))
        assert pq.read_table(path).column("logic_version").to_pylist() == ["v1"]
        named = "says logic_version 'v1', its log entry 'v2'"
    else:
        DeltaTable(log.uri).delete(f"seq = {stored.seq}")  # the unfinished step removed
        named = f"step(s) [{stored.seq}]"
    for logic in ("v1", "v2"):
        error = refused_start(build_of(dsn, root, "shop", ["orders"], logic))
        assert named in str(error) and "rebuild log" in str(error), error
    with pytest.raises(StoreIntegrityError):
        log.newest()


def test_a_rebuild_killed_between_two_tables_rebases_resumes_into_every_sink(
    pg_db: str, tmp_path: Path
) -> None:
    dsn, root, tables = pg_db, str(tmp_path / "store"), ["orders", "returns"]
    seeded(dsn, root, "shop", tables)
    # The second table's rebase is written, the first one's committed: the kill.
    interrupted(dsn, root, "shop", tables, REBASE_WRITTEN, nth=2)
    newest = RebuildLog(root, "shop").newest()
    assert newest is not None and newest.step == "started"
    first = ExpectedState(root, "shop", {t: ["id"] for t in tables}).tables
    assert first["orders"].rebased_by(newest.rebuild) is not None
    assert first["returns"].rebased_by(newest.rebuild) is None
    epochs = inputs()
    report = rebuild(build_of(dsn, root, "shop", tables),
                     lambda _: recompute(LOGICS["v2"], epochs), logic_version="v2")  # fmt: skip
    assert report.resumed and report.step == "switched" and report.rebuild == newest.rebuild
    for table in tables:
        assert sink(dsn, table) == state(LOGICS["v2"], epochs), table
        # Each store table rebased once, by that rebuild.
        store = ExpectedState(root, "shop", {t: ["id"] for t in tables}).tables[table]
        labels = [c.get("reconcile.rebuild") for c in DeltaTable(store.uri).history()]
        assert labels.count(newest.rebuild) == 1, labels
        stored = store.snapshot(2, ["id", "total", "tag"]).to_pylist()
        assert {r["id"]: (r["total"], r["tag"]) for r in stored} == state(LOGICS["v2"], epochs)


def test_another_pipelines_steps_are_neither_read_nor_counted_here(tmp_path: Path) -> None:
    from reconcile.engine.logic import check_logic

    root = str(tmp_path)
    step = {"generation": 0, "logic_version": "v2", "previous": "v1", "base_epoch": 0}
    shop = RebuildLog(root, "shop").append(rebuild="R1", step="started", **step)
    assert RebuildLog(root, "depot").newest() is None
    check_logic(root, "depot", "v1", ["stock"])  # shop's unfinished rebuild is not depot's
    with pytest.raises(ConfigurationError, match=r"R1.*unfinished"):
        check_logic(root, "shop", "v1", ["orders"])
    depot = RebuildLog(root, "depot").append(rebuild="R2", step="started", **step)
    assert (shop.seq, depot.seq) == (0, 0)  # each pipeline numbers its own steps
    assert [e.rebuild for e in RebuildLog(root, "depot").entries()] == ["R2"]


@pytest.mark.slow
def test_one_pipelines_unfinished_rebuild_blocks_no_other_pipeline(
    pg_db: str, tmp_path: Path
) -> None:
    dsn, root = pg_db, str(tmp_path / "store")
    seeded(dsn, root, "shop", ["orders"])
    seeded(dsn, root, "depot", ["stock"])
    interrupted(dsn, root, "shop", ["orders"], REBUILD_STARTED)
    # depot runs on, and is rebuilt and switched, with shop's rebuild unfinished.
    run(build_of(dsn, root, "depot", ["stock"], "v1"), ["stock"], "v1", inputs(4)[3:], first=3)
    depot = rebuild(build_of(dsn, root, "depot", ["stock"]),
                    lambda _: recompute(LOGICS["v2"], inputs(4)), logic_version="v2")  # fmt: skip
    assert depot.step == "switched" and not depot.resumed
    assert sink(dsn, "stock") == state(LOGICS["v2"], inputs(4))
    run(build_of(dsn, root, "depot", ["stock"], "v2"), ["stock"], "v2", inputs(5)[4:], first=4)
    # shop stays blocked until its own rebuild is finished, which it then is.
    with pytest.raises(ConfigurationError, match="unfinished"):
        cycle = build_of(dsn, root, "shop", ["orders"], "v1")()
        try:
            cycle.start()
        finally:
            cycle.close()
    shop = rebuild(build_of(dsn, root, "shop", ["orders"]),
                   lambda _: recompute(LOGICS["v2"], inputs()), logic_version="v2")  # fmt: skip
    assert shop.resumed and shop.step == "switched"
    assert sink(dsn, "orders") == state(LOGICS["v2"], inputs())
    assert [e.step for e in RebuildLog(root, "depot").entries()] == [
        "started", "stored", "applied", "switched"]  # fmt: skip
