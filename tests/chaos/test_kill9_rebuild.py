"""kill -9 of a rebuild (and of its rollback) at every step; then a resume or a rollback.

A rebuild process (``python -m tests.integration.rebuild_pipeline``) brings the
``orders`` sink of three v1 epochs to logic v2, a few rows per sink
transaction, and dies by SIGKILL at a seeded point: after a rebuild log step,
between the store's rebase files and its commit, inside a part's transaction
before its COMMIT, after a part's COMMIT, before the switch. What it leaves is
either the old logic whole or a mix the log names, never an unnamed mix:

- while the log's newest step is unfinished, a v1 writer is refused;
- the rebuild run again converges: the Postgres rows equal a fresh v2 run, a
  full verify finds nothing, no key twice, every row has its ``_epoch`` (the
  store's), and the run wrote exactly the rows the sink still lacked
  (``pg_stat_user_tables``);
- a rollback instead puts v1 back whole, in the sink and in the store, and a v1
  writer then runs.

A rollback killed mid-way is finished by the next rollback; a rebuild run over
a rollback that already rebased the store is refused, writing nothing.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from expected_state.rebuilds import RebuildLog
from reconcile.core.contract import ConfigurationError
from reconcile.engine.expected import ExpectedState
from reconcile.rebuild import rebuild, rollback
from reconcile.recovery import recover
from tests.integration.rebuild_pipeline import (
    LOGICS,
    PIPELINE,
    build,
    inputs,
    recompute,
    rows_written,
    rows_written_since,
    run_epochs,
    seed,
    state,
)

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

REPO = Path(__file__).resolve().parents[2]
PART_ROWS = 4  # v2 deletes 8 rows and changes 12: five parts of at most four rows

# (point, nth hit, the rebuild log's newest step after the kill)
KILLS = [
    ("rebuild.started", 1, "started"),
    ("expected_state.rebase.written", 1, "started"),  # the store's files, before its commit
    ("rebuild.stored", 1, "stored"),
    ("pg.repair.applied", 1, "stored"),  # inside the first part's txn, before COMMIT
    ("pg.repair.applied", 3, "stored"),
    ("rebuild.part.applied", 1, "stored"),  # after the first part's COMMIT
    ("rebuild.part.applied", 3, "stored"),
    ("rebuild.applied", 1, "applied"),
]
KILL_IDS = [f"{point}-{nth}" for point, nth, _ in KILLS]


def _sink(dsn: str) -> dict[int, tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT id, total, tag FROM orders ORDER BY id").fetchall()
    return {r[0]: (r[1], r[2]) for r in rows}


def _store(root: str) -> dict[int, tuple[Any, ...]]:
    store = ExpectedState(root, PIPELINE, {"orders": ["id"]}).tables["orders"]
    rows = store.snapshot(2, ["id", "total", "tag"]).to_pylist()
    return {r["id"]: (r["total"], r["tag"]) for r in rows}


def _changed(old: dict[int, Any], new: dict[int, Any]) -> int:
    return sum(1 for k in new if old.get(k) != new[k]) + sum(1 for k in old if k not in new)


def _others_gone(dsn: str) -> None:
    """Wait until no other session of the database is left (a killed client's backend exits,
    and flushes its table counts as it does)."""
    deadline = time.monotonic() + 15
    with psycopg.connect(dsn, autocommit=True) as conn:
        while True:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
            ).fetchone()
            if row is not None and row[0] == 0:
                return
            assert time.monotonic() < deadline, "a session of the killed process stays"
            time.sleep(0.1)


def _run(dsn: str, root: str, tmp_path: Path, what: str, point: str | None, nth: int = 1) -> None:
    """Run the rebuild (or rollback) process, killed by SIGKILL at the nth hit of ``point``
    (None: to its end)."""
    once = tmp_path / f"killed-{what}-{point}-{nth}"
    kill = {"RECONCILE_KILL_AT": f"{point}:{nth}", "RECONCILE_KILL_ONCE": str(once)}
    done = subprocess.run(
        [sys.executable, "-m", "tests.integration.rebuild_pipeline", dsn, root, "v2", what,
         str(PART_ROWS)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), **(kill if point else {})},
        capture_output=True,
        text=True,
        timeout=180,
    )  # fmt: skip
    if point is None:
        assert done.returncode == 0, done.stderr[-2000:]
        return
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    assert once.read_text().split()[1] == point  # the kill fired, there
    _others_gone(dsn)


def _refused_or_whole(dsn: str, root: str, step: str | None) -> None:
    """The log names the mix and no writer may start on it; or the old logic is whole."""
    newest = RebuildLog(root, PIPELINE).newest()
    if newest is None:  # killed before the log's first step: nothing of v2 anywhere
        assert step is None
        assert _sink(dsn) == state(LOGICS["v1"], inputs()) == _store(root)
        return
    assert newest.step == step and not newest.finished
    for logic in ("v1", "v2"):
        cycle = build(dsn, root, logic)()
        try:
            with pytest.raises(ConfigurationError, match="unfinished"):
                cycle.start()
        finally:
            cycle.close()


def _converged(dsn: str, root: str, logic: str, *, same_epochs: bool = True) -> None:
    """The sink is a fresh run of ``logic``, whole: by its rows, a verify, its keys and epochs.

    ``same_epochs``: every row's ``_epoch`` is the store's. A rollback's store
    gives the rows the rebuild had changed in the store the rollback's epoch,
    also where the sink never got the change (the sink keeps the row's epoch).
    """
    expected = state(LOGICS[logic], inputs())
    assert _sink(dsn) == expected == _store(root)
    verify = recover(dsn, root, PIPELINE, "orders", mode="full", dry_run=True)
    assert (verify.missing, verify.extra, verify.changed) == (0, 0, 0)
    store = ExpectedState(root, PIPELINE, {"orders": ["id"]}).tables["orders"]
    stored = {r["id"]: r["_epoch"] for r in store.snapshot(2, ["id", "_epoch"]).to_pylist()}
    # n_live_tup is what backends report: an idle one flushes its counts within
    # PostgreSQL's longest stats interval (60 s), a long wait on a loaded machine.
    deadline = time.monotonic() + 75
    with psycopg.connect(dsn, autocommit=True) as conn:
        count, keys, epochs = conn.execute(
            "SELECT count(*), count(DISTINCT id), count(_epoch) FROM orders"
        ).fetchone() or (0, 0, 0)
        assert count == keys == epochs == len(expected)
        epochs_of: dict[int, int | None] = dict(
            conn.execute("SELECT id, _epoch FROM orders").fetchall()
        )
        if same_epochs:
            assert epochs_of == stored
        assert all(e is not None and 0 <= e <= 2 for e in epochs_of.values())
        vacuumed = False
        while True:  # Postgres's own count of live rows: no duplicate hides anywhere
            conn.execute("SELECT pg_stat_clear_snapshot()")
            live = conn.execute(
                "SELECT n_live_tup FROM pg_stat_user_tables WHERE relname = 'orders'"
            ).fetchone()
            if live and live[0] == len(expected):
                break
            if time.monotonic() > deadline:
                if vacuumed:
                    break
                # The backends' counts can stay short of the rows (an autovacuum
                # that skipped all-visible pages estimates the rest): a VACUUM
                # of every page counts the heap's live tuples itself.
                conn.execute("VACUUM (DISABLE_PAGE_SKIPPING) orders")
                vacuumed, deadline = True, time.monotonic() + 15
            time.sleep(0.2)
        assert live is not None and live[0] == len(expected), (live, vacuumed)


@pytest.fixture
def shop(pg_db: str, tmp_path: Path) -> tuple[str, str]:
    """Three epochs of logic v1 in the sink and the store."""
    return seed(pg_db, str(tmp_path / "store"))


def _rebuild_v2(dsn: str, root: str) -> None:
    epochs = inputs()
    report = rebuild(build(dsn, root), lambda _: recompute(LOGICS["v2"], epochs),
                     logic_version="v2", part_rows=PART_ROWS)  # fmt: skip
    assert report.resumed and report.step == "switched"


@pytest.mark.parametrize(("point", "nth", "step"), KILLS, ids=KILL_IDS)
def test_a_rebuild_killed_at_any_step_blocks_writers_then_resumes_to_the_new_logic(
    shop: tuple[str, str], tmp_path: Path, point: str, nth: int, step: str
) -> None:
    dsn, root = shop
    _run(dsn, root, tmp_path, "apply", point, nth)
    _refused_or_whole(dsn, root, step)
    left = _sink(dsn)
    before = rows_written(dsn)
    _rebuild_v2(dsn, root)
    _converged(dsn, root, "v2")
    # The resume wrote exactly what the killed process had not: nothing twice.
    missing = _changed(left, state(LOGICS["v2"], inputs()))
    assert rows_written_since(dsn, before, missing) == missing
    assert RebuildLog(root, PIPELINE).newest().step == "switched"  # type: ignore[union-attr]
    run_epochs(dsn, root, "v2", inputs(4)[3:], first=3)  # only the new logic runs on
    assert _sink(dsn) == state(LOGICS["v2"], inputs(4))


def _v1_runs_on(dsn: str, root: str) -> None:
    run_epochs(dsn, root, "v1", inputs(4)[3:], first=3)
    assert _sink(dsn) == state(LOGICS["v1"], inputs(4))


@pytest.mark.parametrize(("point", "nth", "step"), KILLS, ids=KILL_IDS)
def test_a_rebuild_killed_at_any_step_rolls_back_to_the_old_logic_whole(
    shop: tuple[str, str], tmp_path: Path, point: str, nth: int, step: str
) -> None:
    dsn, root = shop
    _run(dsn, root, tmp_path, "apply", point, nth)
    _refused_or_whole(dsn, root, step)
    report = rollback(build(dsn, root))
    assert report.step == "rolled_back"
    _converged(dsn, root, "v1", same_epochs=False)
    _v1_runs_on(dsn, root)


def test_a_rollback_killed_before_its_store_commit_leaves_the_rebuild_to_resume(
    shop: tuple[str, str], tmp_path: Path
) -> None:
    dsn, root = shop
    _run(dsn, root, tmp_path, "apply", "rebuild.part.applied", 3)
    _run(dsn, root, tmp_path, "rollback", "expected_state.rebase.written", 1)
    _refused_or_whole(dsn, root, "stored")
    _rebuild_v2(dsn, root)
    _converged(dsn, root, "v2")


def test_a_rollback_killed_in_its_sink_transaction_is_finished_by_the_next_rollback(
    shop: tuple[str, str], tmp_path: Path
) -> None:
    dsn, root = shop
    _run(dsn, root, tmp_path, "apply", "rebuild.part.applied", 3)
    # The store is back at v1; the sink's converge died before its COMMIT.
    _run(dsn, root, tmp_path, "rollback", "pg.repair.applied", 1)
    _refused_or_whole(dsn, root, "stored")
    assert _store(root) == state(LOGICS["v1"], inputs())
    left = _sink(dsn)
    # A resume would take the store's v1 state for v2's and switch to v2 on it.
    with pytest.raises(ConfigurationError, match="a rollback of it was interrupted"):
        _rebuild_v2(dsn, root)
    assert _sink(dsn) == left
    _refused_or_whole(dsn, root, "stored")
    assert rollback(build(dsn, root)).step == "rolled_back"
    _converged(dsn, root, "v1", same_epochs=False)
    _v1_runs_on(dsn, root)


def test_a_resume_killed_in_its_own_pull_and_diff_is_resumed_again_by_a_new_process(
    shop: tuple[str, str], tmp_path: Path
) -> None:
    dsn, root = shop
    _run(dsn, root, tmp_path, "apply", "rebuild.part.applied", 1)
    # The resume brings the sink to the store by a full pull-and-diff, in one
    # transaction; it dies inside it, before its COMMIT.
    left = _sink(dsn)
    _run(dsn, root, tmp_path, "apply", "pg.repair.applied", 1)
    assert _sink(dsn) == left
    _refused_or_whole(dsn, root, "stored")
    _run(dsn, root, tmp_path, "apply", None)
    assert RebuildLog(root, PIPELINE).newest().step == "switched"  # type: ignore[union-attr]
    _converged(dsn, root, "v2")
