"""Property: any sequence of epochs, rebuilds and interrupted rebuilds ends as a fresh run would.

Hypothesis draws a sequence of operations on a real Postgres sink and store:
run a few epochs under the logic in force; rebuild to a logic drawn from a
small family (``total = qty * a + b``, ids divisible by ``m`` dropped, a tag
or NULL), in parts of a drawn size, possibly interrupted at a drawn step (a
failure raised at its hook point), and then either resumed (the same rebuild
again) or rolled back. Whatever the sequence, the Postgres rows equal a fresh
run of the last logic in force over every epoch so far (a rebuild recomputes
from all the retained input), a full verify finds nothing, and no writer
started on an interrupted rebuild.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, Phase, example, given, seed, settings
from hypothesis import strategies as st

from expected_state.rebasing import REBASE_WRITTEN
from expected_state.rebuilds import RebuildLog
from reconcile.core import hooks
from reconcile.core.contract import ConfigurationError
from reconcile.core.results import CommitSucceeded
from reconcile.engine.expected import ExpectedState
from reconcile.rebuild import rebuild, rollback
from reconcile.rebuild.apply import PART_APPLIED
from reconcile.rebuild.run import REBUILD_APPLIED, REBUILD_STARTED, REBUILD_STORED
from reconcile.recovery import recover
from sinks.postgres.repair import REPAIR_APPLIED
from tests.fix_pg import PgServer
from tests.integration.rebuild_pipeline import DDL, PIPELINE, build, outputs, recompute, state

pytestmark = pytest.mark.integration

SEED = int(os.environ.get("RECONCILE_CHAOS_SEED", "20261128"))
POINTS = [REBUILD_STARTED, REBASE_WRITTEN, REBUILD_STORED, REPAIR_APPLIED, PART_APPLIED,
          REBUILD_APPLIED]  # fmt: skip


class Boom(Exception):
    """The failure a hook point raises, as a crash would stop the rebuild there."""


@dataclass(frozen=True)
class Logic:
    """One logic of the family: ``total = qty * a + b``; ids divisible by ``m`` dropped."""

    a: int
    b: int
    m: int  # 0: none dropped
    tag: str | None

    @property
    def name(self) -> str:
        return f"a{self.a}-b{self.b}-m{self.m}-t{self.tag}"

    def __call__(self, event_id: int, qty: int) -> dict[str, Any] | None:
        if self.m and event_id % self.m == 0:
            return None
        return {"id": event_id, "total": qty * self.a + self.b, "tag": self.tag}


FIRST = Logic(10, 0, 0, "a")
LOGICS = st.builds(Logic, st.sampled_from([1, 10]), st.sampled_from([0, 5]),
                   st.sampled_from([0, 3, 7]), st.sampled_from(["a", "b", None]))  # fmt: skip
INTERRUPTS = st.none() | st.tuples(
    st.sampled_from(POINTS), st.integers(1, 2), st.sampled_from(["resume", "rollback"])
)
OPS = st.lists(
    st.tuples(st.just("run"), st.integers(1, 2))
    | st.tuples(st.just("rebuild"), LOGICS, INTERRUPTS, st.sampled_from([2, 5, 1000])),
    min_size=1,
    max_size=4,
)

# No shrinking: each example costs real database round trips; the failing ops are printed.
SETTINGS = settings(max_examples=8, deadline=None, database=None,
                    phases=[Phase.explicit, Phase.reuse, Phase.generate],
                    suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip


def events(epoch: int) -> list[tuple[int, int]]:
    """Epoch ``epoch``'s events: 12 ids, half of them seen in the epoch before."""
    return [(i, (i * 7 + epoch * 3) % 11 + 1) for i in range(epoch * 6, epoch * 6 + 12)]


def _sink(dsn: str) -> dict[int, tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT id, total, tag FROM orders ORDER BY id").fetchall()
    return {r[0]: (r[1], r[2]) for r in rows}


def _start(dsn: str, root: str, logic: Logic) -> None:
    cycle = build(dsn, root, logic.name)()
    try:
        cycle.start()
    finally:
        cycle.close()


class Pipeline:
    """The sink, its store, the epochs so far and the logic in force."""

    def __init__(self, dsn: str, root: str) -> None:
        self.dsn, self.root = dsn, root
        self.epochs: list[list[tuple[int, int]]] = []
        self.logic = FIRST
        self.rolled_back = False

    def run(self, count: int) -> None:
        cycle = build(self.dsn, self.root, self.logic.name)()
        try:
            cycle.start()
            for _ in range(count):
                epoch = len(self.epochs)
                self.epochs.append(events(epoch))
                rows = outputs(self.logic, self.epochs[-1])
                result = cycle.run_epoch(epoch, {"orders": rows})
                assert isinstance(result, CommitSucceeded), result
        finally:
            cycle.close()

    def rebuild(self, logic: Logic, part_rows: int) -> Any:
        epochs = list(self.epochs)
        return rebuild(build(self.dsn, self.root), lambda _: recompute(logic, epochs),
                       logic_version=logic.name, previous=self.logic.name,
                       part_rows=part_rows)  # fmt: skip


def test_any_sequence_of_epochs_and_rebuilds_converges_to_a_fresh_run_of_the_last_logic(
    pg_server: PgServer, tmp_path: Path
) -> None:
    totals = {"examples": 0, "interrupted": 0, "resumed": 0, "rolled_back": 0}

    @seed(SEED)
    @SETTINGS
    @given(ops=OPS)
    # Both ways out of an interrupted rebuild, whatever the seed draws: resumed
    # after some parts landed, rolled back once the store was rebased.
    @example(ops=[("run", 1), ("rebuild", Logic(1, 5, 7, None), (PART_APPLIED, 2, "resume"), 2)])
    @example(ops=[("rebuild", Logic(10, 0, 3, "b"), (REBUILD_STORED, 1, "rollback"), 5),
                  ("run", 1)])  # fmt: skip
    def check(ops: list[tuple[Any, ...]]) -> None:
        totals["examples"] += 1
        name = pg_server.create_database("rb")
        dsn = pg_server.dsn(name)
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(DDL)
            pipeline = Pipeline(dsn, tempfile.mkdtemp(dir=tmp_path))
            pipeline.run(1)  # a rebuild needs a decided epoch
            for op in ops:
                _apply(pipeline, op, totals)
                assert _sink(dsn) == state(pipeline.logic, pipeline.epochs), ops
            _converged(pipeline, ops)
        finally:
            pg_server.drop_database(name)

    check()
    print(f"rebuild property (seed {SEED}): {totals}")
    # Every path was taken: the interrupts fired, and both ways out of them ran.
    assert totals["resumed"] > 0 and totals["rolled_back"] > 0, totals


def _apply(pipeline: Pipeline, op: tuple[Any, ...], totals: dict[str, int]) -> None:
    if op[0] == "run":
        pipeline.run(op[1])
        return
    _, logic, interrupt, part_rows = op
    if interrupt is None:
        pipeline.rebuild(logic, part_rows)
        pipeline.logic = logic
        return
    point, nth, then = interrupt

    def boom() -> None:
        raise Boom(point)

    with hooks.at(point, boom, nth=nth) as armed, contextlib.suppress(Boom):
        pipeline.rebuild(logic, part_rows)
    if not armed.fired:  # fewer parts (or none) than the nth: the rebuild finished
        pipeline.logic = logic
        return
    totals["interrupted"] += 1
    newest = RebuildLog(pipeline.root, PIPELINE).newest()
    assert newest is not None and not newest.finished
    with pytest.raises(ConfigurationError, match="unfinished"):
        _start(pipeline.dsn, pipeline.root, pipeline.logic)
    if then == "resume":
        report = pipeline.rebuild(logic, part_rows)
        assert report.resumed and report.step == "switched"
        pipeline.logic = logic
        totals["resumed"] += 1
    else:
        assert rollback(build(pipeline.dsn, pipeline.root)).step == "rolled_back"
        pipeline.rolled_back = True
        totals["rolled_back"] += 1


def _converged(pipeline: Pipeline, ops: list[tuple[Any, ...]]) -> None:
    dsn, root = pipeline.dsn, pipeline.root
    verify = recover(dsn, root, PIPELINE, "orders", mode="full", dry_run=True)
    assert (verify.missing, verify.extra, verify.changed) == (0, 0, 0), ops
    store = ExpectedState(root, PIPELINE, {"orders": ["id"]}).tables["orders"]
    stored = {r["id"]: r["_epoch"] for r in store.snapshot(None, ["id", "_epoch"]).to_pylist()}
    with psycopg.connect(dsn) as conn:
        epochs: dict[int, int | None] = dict(
            conn.execute("SELECT id, _epoch FROM orders").fetchall()
        )
    assert None not in epochs.values(), ops
    if not pipeline.rolled_back:
        # The epoch of each row's last change, in the sink as in the store. (A
        # rollback's store gives the rows the rebuild had changed there the
        # rollback's epoch, where the sink may keep the row's own.)
        assert epochs == stored, ops
    # The logic in force is the only one that may write now.
    _start(dsn, root, pipeline.logic)
