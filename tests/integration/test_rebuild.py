"""Rebuild by diff: a Postgres sink brought to new logic, only the differing rows written.

Every assertion reads Postgres (the table's rows, ``pg_stat_user_tables``,
``reconcile_repairs``) or the Delta log, never the report alone: the sink
ends equal to a fresh run of the new logic, the rows written are the rows
that changed, the store holds the new state, and only a writer of the new
logic may start afterwards. Interrupted rebuilds (a failure raised at a
step's hook point) block every writer, resume, or roll back whole.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest
from deltalake import DeltaTable

from expected_state.rebuilds import RebuildLog
from reconcile.core import hooks
from reconcile.core.contract import ConfigurationError, FencedError, InvalidInputError
from reconcile.core.results import CommitFatal
from reconcile.engine.expected import ExpectedState
from reconcile.rebuild import plan, rebuild, rollback
from reconcile.rebuild.apply import PART_APPLIED
from reconcile.rebuild.run import REBUILD_APPLIED, REBUILD_STARTED, REBUILD_STORED
from reconcile.recovery import recover
from tests.integration.rebuild_pipeline import (
    LOGICS,
    PIPELINE,
    build,
    inputs,
    outputs,
    recompute,
    rows_written,
    rows_written_since,
    run_epochs,
    seed,
    state,
)

pytestmark = pytest.mark.integration


class Boom(Exception):
    """The failure a hook point raises, as a crash would stop the rebuild there."""


def _sink(dsn: str) -> dict[int, tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT id, total, tag FROM orders ORDER BY id").fetchall()
    return {r[0]: (r[1], r[2]) for r in rows}


@pytest.fixture
def shop(pg_db: str, tmp_path: Path) -> tuple[str, str]:
    """Three epochs of logic v1 in the sink and the store."""
    dsn, root = seed(pg_db, str(tmp_path / "store"))
    assert _sink(dsn) == state(LOGICS["v1"], inputs())
    return dsn, root


def _changed(old: dict[int, Any], new: dict[int, Any]) -> int:
    return sum(1 for k in new if old.get(k) != new[k]) + sum(1 for k in old if k not in new)


def test_a_rebuild_writes_only_the_changed_rows_and_switches_the_logic(
    shop: tuple[str, str],
) -> None:
    dsn, root = shop
    epochs = inputs()
    old, new = state(LOGICS["v1"], epochs), state(LOGICS["v2"], epochs)
    changed = _changed(old, new)
    assert changed > 2  # several updates and several deletes: a boundary worth testing
    before = rows_written(dsn)
    report = rebuild(build(dsn, root), lambda _: recompute(LOGICS["v2"], epochs),
                     logic_version="v2", part_rows=4)  # fmt: skip
    assert _sink(dsn) == new
    # Postgres's own count of rows written: exactly the rows that changed.
    assert rows_written_since(dsn, before, changed) == changed
    table = report.tables["orders"]
    assert table.plan is not None and table.plan.changed == changed == table.applied
    upserts = table.plan.inserts + table.plan.updates
    assert table.parts == -(-table.plan.deletes // 4) + -(-upserts // 4)
    with psycopg.connect(dsn) as conn:
        modes = conn.execute(
            "SELECT DISTINCT mode, epoch FROM reconcile.reconcile_repairs"
        ).fetchall()  # fmt: skip
    assert modes == [(f"rebuild {report.rebuild} logic v2", 2)]
    # The store holds the new state, labelled with the logic version.
    expected = ExpectedState(root, PIPELINE, {"orders": ["id"]}).tables["orders"]
    stored = expected.snapshot(2, ["id", "total", "tag", "_epoch"]).to_pylist()
    assert {r["id"]: (r["total"], r["tag"]) for r in stored} == new
    # A row the new logic left as it was keeps the epoch that wrote it; the rest: epoch 2.
    last_written = {i: e for e, events in enumerate(epochs) for i, _ in events}
    assert {r["id"]: r["_epoch"] for r in stored} == {
        k: (last_written[k] if old.get(k) == new[k] else 2) for k in new
    }
    history = DeltaTable(expected.uri).history(1)[0]
    assert history["reconcile.logic_version"] == "v2"
    assert history["reconcile.rebuild"] == report.rebuild
    assert RebuildLog(root, PIPELINE).newest().step == "switched"  # type: ignore[union-attr]
    verify = recover(dsn, root, PIPELINE, "orders", mode="full", dry_run=True)
    assert (verify.missing, verify.extra, verify.changed) == (0, 0, 0)


def test_only_a_writer_of_the_new_logic_starts_and_it_resumes_at_the_next_epoch(
    shop: tuple[str, str],
) -> None:
    dsn, root = shop
    epochs = inputs(4)
    rebuild(build(dsn, root), lambda _: recompute(LOGICS["v2"], epochs[:3]), logic_version="v2")
    with pytest.raises(ConfigurationError, match=r"runs logic 'v1'.*hold logic 'v2'"):
        run_epochs(dsn, root, "v1", epochs[3:], first=3)
    assert _sink(dsn) == state(LOGICS["v2"], epochs[:3])  # the refused writer wrote nothing
    run_epochs(dsn, root, "v2", epochs[3:], first=3)
    assert _sink(dsn) == state(LOGICS["v2"], epochs)


def test_a_plan_writes_nothing_and_counts_each_kind(shop: tuple[str, str]) -> None:
    dsn, root = shop
    epochs = inputs()
    store = ExpectedState(root, PIPELINE, {"orders": ["id"]}).tables["orders"]
    version = DeltaTable(store.uri).version()
    report = plan(build(dsn, root), lambda _: recompute(LOGICS["v2"], epochs), logic_version="v2")
    old, new = state(LOGICS["v1"], epochs), state(LOGICS["v2"], epochs)
    got = report.tables["orders"].plan
    assert got is not None
    assert got.deletes == len(set(old) - set(new))
    assert got.updates == sum(1 for k in new if k in old and old[k] != new[k])
    assert got.inserts == len(set(new) - set(old))
    assert DeltaTable(store.uri).version() == version
    assert _sink(dsn) == old
    assert RebuildLog(root, PIPELINE).newest() is None


@pytest.mark.parametrize(
    ("point", "nth", "step"),
    [(REBUILD_STARTED, 1, "started"), (REBUILD_STORED, 1, "stored"), (PART_APPLIED, 2, "stored"),
     (REBUILD_APPLIED, 1, "applied")],
)  # fmt: skip
def test_an_interrupted_rebuild_blocks_every_writer_then_resumes(
    shop: tuple[str, str], point: str, nth: int, step: str
) -> None:
    dsn, root = shop
    epochs = inputs()

    def boom() -> None:
        raise Boom(point)

    with hooks.at(point, boom, nth=nth) as armed, pytest.raises(Boom):
        rebuild(build(dsn, root), lambda _: recompute(LOGICS["v2"], epochs), logic_version="v2",
                part_rows=4)  # fmt: skip
    assert armed.fired == 1
    newest = RebuildLog(root, PIPELINE).newest()
    assert newest is not None and newest.step == step
    for logic in ("v1", "v2", None):
        with pytest.raises(ConfigurationError, match="unfinished"):
            cycle = build(dsn, root, logic)()
            try:
                cycle.start()
            finally:
                cycle.close()
    with pytest.raises(ConfigurationError, match="finish it with logic version 'v2'"):
        rebuild(build(dsn, root), lambda _: recompute(LOGICS["v1"], epochs), logic_version="v3")
    report = rebuild(build(dsn, root), lambda _: recompute(LOGICS["v2"], epochs),
                     logic_version="v2")  # fmt: skip
    assert report.resumed and report.step == "switched"
    assert _sink(dsn) == state(LOGICS["v2"], epochs)
    verify = recover(dsn, root, PIPELINE, "orders", mode="full", dry_run=True)
    assert (verify.missing, verify.extra, verify.changed) == (0, 0, 0)


@pytest.mark.parametrize(("point", "nth"), [(REBUILD_STARTED, 1), (PART_APPLIED, 2)])
def test_a_rollback_puts_the_old_logic_back_whole(
    shop: tuple[str, str], point: str, nth: int
) -> None:
    dsn, root = shop
    epochs = inputs()
    old = state(LOGICS["v1"], epochs)

    def boom() -> None:
        raise Boom(point)

    with hooks.at(point, boom, nth=nth), pytest.raises(Boom):
        rebuild(build(dsn, root), lambda _: recompute(LOGICS["v2"], epochs), logic_version="v2",
                part_rows=4, previous="v1")  # fmt: skip
    report = rollback(build(dsn, root))
    assert report.step == "rolled_back"
    assert _sink(dsn) == old
    store = ExpectedState(root, PIPELINE, {"orders": ["id"]}).tables["orders"]
    stored = store.snapshot(2, ["id", "total", "tag"]).to_pylist()
    assert {r["id"]: (r["total"], r["tag"]) for r in stored} == old
    # The old logic runs again, and a rollback of a finished rebuild is refused.
    run_epochs(dsn, root, "v1", inputs(4)[3:], first=3)
    assert _sink(dsn) == state(LOGICS["v1"], inputs(4))
    with pytest.raises(ConfigurationError, match="is finished"):
        rollback(build(dsn, root))


def test_a_rebuild_fences_the_writer_it_took_over_from(shop: tuple[str, str]) -> None:
    dsn, root = shop
    epochs = inputs(4)
    zombie = build(dsn, root, "v1")()
    zombie.start()
    try:
        rebuild(build(dsn, root), lambda _: recompute(LOGICS["v2"], epochs[:3]),
                logic_version="v2")  # fmt: skip
        result = zombie.run_epoch(3, {"orders": outputs(LOGICS["v1"], epochs[3])})
        assert isinstance(result, CommitFatal) and not result.restart
        assert isinstance(result.error, FencedError), result
    finally:
        zombie.close()
    assert _sink(dsn) == state(LOGICS["v2"], epochs[:3])


def test_a_new_logic_that_repeats_a_key_is_refused_before_anything_is_written(
    shop: tuple[str, str],
) -> None:
    import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]

    dsn, root = shop
    doubled = pa.table({"id": [1, 1], "total": [1, 2], "tag": ["a", "b"]})
    with pytest.raises(
        InvalidInputError, match=r"orders: the new logic gives 1 keys more than once .*\{.id.: 1\}"
    ):
        rebuild(build(dsn, root), lambda _: doubled, logic_version="v2")
    assert _sink(dsn) == state(LOGICS["v1"], inputs())
    assert RebuildLog(root, PIPELINE).newest() is None
