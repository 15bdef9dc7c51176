"""The commit cycle with the expected state on the write path, under faults and real kills.

Each epoch's outputs are recorded in the store, then the decision is written,
then the sinks commit. The runs here compute new values at every call, so the
final check is strict: every sink holds, for every epoch, exactly the rows the
store recorded (the run that reached the decision), none of another run's.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from reconcile.core import hooks
from reconcile.engine.cycle import DECIDED, RECORDED
from reconcile.engine.faults import Fault, SimulatedCrash
from reconcile.testing.harness import SinkHarness
from reconcile.testing.matrix import EPOCHS, MATRIX, run_row
from reconcile.testing.scenario import SINKS, Scenario
from tests.chaos.kill_pipeline import harness_for

pytestmark = [pytest.mark.chaos, pytest.mark.integration]

REPO = Path(__file__).resolve().parents[2]
STORE_KINDS = ["memory", "postgres", "postgres_prepared"]


@pytest.fixture(params=STORE_KINDS)
def store_harness(request: pytest.FixtureRequest) -> SinkHarness:
    harness: SinkHarness = request.getfixturevalue(f"{request.param}_harness")
    return harness


@pytest.mark.parametrize(("row", "faults"), MATRIX, ids=[r for r, _ in MATRIX])
def test_failure_matrix_with_expected_state(
    row: str, faults: list[Fault], store_harness: SinkHarness, tmp_path: Path
) -> None:
    run_row(store_harness, row, faults, tmp_path / "state", expected_root=tmp_path / "expected")


def _crash() -> None:
    raise SimulatedCrash("crash at a named point")


@pytest.mark.parametrize("point", [RECORDED, DECIDED])
def test_a_crash_at_either_side_of_the_decision(
    point: str, store_harness: SinkHarness, tmp_path: Path
) -> None:
    # RECORDED: the store holds epoch 1's outputs, undecided: start() reverts
    # them and the epoch runs again with other values. DECIDED: the sinks are
    # behind the store: they get the recorded run (prepared, or replayed from
    # the store), never a recomputation.
    scenario = Scenario(store_harness, tmp_path / "state", expected_root=tmp_path / "expected")
    with hooks.at(point, _crash, nth=2) as armed:
        report = scenario.run(EPOCHS)
    assert armed.fired == 1
    assert report.committed_epochs == EPOCHS and report.restarts >= 1
    scenario.check(EPOCHS)


KILL_POINTS = [
    ("after-recording", f"{RECORDED}:2"),
    ("after-decision", f"{DECIDED}:2"),
    ("in-the-sink-commit", None),
]


@pytest.mark.parametrize(("row", "spec"), KILL_POINTS, ids=[k[0] for k in KILL_POINTS])
@pytest.mark.parametrize("kind", ["postgres", "postgres_prepared"])
def test_kill9_around_the_decision_then_restart(
    row: str, spec: str | None, kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    server = request.getfixturevalue("pg_server")
    db = server.create_database("ek9")
    target = server.dsn(db)
    env = {**os.environ, "PYTHONPATH": str(REPO), "RECONCILE_EXPECTED_STATE": "1"}
    fault = [] if spec else ["sink.beta.commit", "2", "after"]
    killed = subprocess.run(
        [sys.executable, "-m", "tests.chaos.kill_pipeline", kind, target, str(tmp_path),
         "4", "0", *fault],
        cwd=REPO, env={**env, **({"RECONCILE_KILL_AT": spec} if spec else {})},
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    restarted = subprocess.run(
        [sys.executable, "-m", "tests.chaos.kill_pipeline", kind, target, str(tmp_path),
         "4", "100"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert restarted.returncode == 0, restarted.stderr[-3000:]
    scenario = Scenario(
        harness_for(kind, target), tmp_path / "state", sinks=SINKS, nonce_base=200,
        expected_root=tmp_path / "expected",
    )  # fmt: skip
    scenario.check(list(range(4)))
    with server.connect(db) as conn:
        for (gid,) in conn.execute("SELECT gid FROM pg_prepared_xacts").fetchall():
            conn.execute("ROLLBACK PREPARED %s", (gid,))  # type: ignore[arg-type]
    server.drop_database(db)


def test_a_refused_decision_reverts_what_was_recorded(
    memory_harness: SinkHarness, tmp_path: Path
) -> None:
    # The outputs are recorded, then the decision is refused (definitely): the
    # epoch is aborted, and the store must not keep the aborted run's changes,
    # or the next run of the epoch would be taken as recorded already.
    from reconcile.core.contract import RetryableError
    from reconcile.core.results import CommitAborted

    scenario = Scenario(memory_harness, tmp_path / "state", expected_root=tmp_path / "expected")
    cycle = scenario.build()
    cycle.start()
    assert cycle.run_epoch(0, scenario.outputs(0))

    def refuse() -> None:
        raise RetryableError("the epochs table refused the decision")

    with hooks.at(RECORDED, refuse) as armed:
        result = cycle.run_epoch(1, scenario.outputs(1))
    assert armed.fired == 1 and isinstance(result, CommitAborted), result
    assert scenario.expected().tables["alpha"].last_epoch() == 0  # reverted
    assert cycle.run_epoch(1, scenario.outputs(1))  # the next run is recorded
    cycle.close()
    scenario.check([0, 1])


def test_a_stranded_txn_the_log_no_longer_knows_is_rolled_back_and_the_sink_diffed(
    postgres_prepared_harness: SinkHarness, tmp_path: Path
) -> None:
    # The log was compacted past epoch 1, the sink lost epoch 1's rows and
    # marker (by hand), and a zombie holds a prepared txn of epoch 1 with rows
    # of its own. The log cannot decide that txn; the store can stand in:
    # start() rolls it back and brings the sink to the store's state by
    # pull-and-diff, with no human step and none of the zombie's rows.
    import psycopg

    from reconcile import CommitCycle, CommitSucceeded
    from reconcile.core.contract import OK, SinkTxnId, WriterIdentity
    from reconcile.core.progress import EpochStatus
    from reconcile.core.sink import bind_writer
    from reconcile.testing.scenario import PIPELINE, rows_for

    harness = postgres_prepared_harness
    scenario = Scenario(harness, tmp_path / "state", sinks=["alpha"], expected_root=tmp_path / "e")
    cycle = CommitCycle(PIPELINE, [harness.new_sink("alpha")], expected_state=scenario.expected())
    cycle.start()
    for e in range(4):
        assert cycle.run_epoch(e, scenario.outputs(e)) == CommitSucceeded(e)
    generation = cycle.generation or 0
    cycle.close()
    expected = scenario.expected()
    assert expected.progress.compact(generation, keep_epochs=1)
    assert expected.progress.status(1) is EpochStatus.UNKNOWN
    dsn = harness.dsn  # type: ignore[attr-defined]
    with psycopg.connect(dsn, autocommit=True) as conn:
        lost = conn.execute("DELETE FROM alpha WHERE _epoch = 1").rowcount
        conn.execute("DELETE FROM reconcile.reconcile_commits WHERE sink = 'alpha' AND epoch = 1")
    assert lost > 0
    zombie = harness.new_sink("alpha")
    bind_writer(zombie, WriterIdentity(PIPELINE, expected.progress.log_id))
    ghost = SinkTxnId(PIPELINE, "alpha", 1, generation)
    zombie_rows = [{"k": f"zombie-{i}", "v": 666} for i in range(3)] + rows_for(1, nonce=999)
    assert zombie.stage(ghost, zombie_rows) == OK
    assert zombie.prepare(ghost) == OK
    zombie.close()
    assert harness.prepared("alpha") == [ghost]

    restarted = CommitCycle(
        PIPELINE, [harness.new_sink("alpha")], expected_state=scenario.expected()
    )
    report = restarted.start()
    restarted.close()
    assert harness.prepared("alpha") == []
    assert str(ghost) in report.aborted
    assert report.repaired["alpha"] >= lost
    store = scenario.expected().tables["alpha"]
    want = {r["k"]: r["v"] for r in store.snapshot(columns=["k", "v"]).to_pylist()}
    with psycopg.connect(dsn, autocommit=True) as conn:
        held = dict(conn.execute("SELECT k, v FROM alpha").fetchall())
    assert held == want


def test_the_cycle_keeps_the_store_folded_between_epochs(
    memory_harness: SinkHarness, tmp_path: Path
) -> None:
    # Merge-on-read stays proportional to the epoch only if the change files
    # are folded now and then: the cycle runs the store's housekeeping after
    # each committed epoch, so a long run does not pile them up.
    from expected_state.delta_log import last_checkpoint
    from expected_state.housekeeping import DEFAULT_COMPACT_CHANGES_AFTER
    from expected_state.reading import live_files
    from reconcile import CommitSucceeded

    scenario = Scenario(
        memory_harness, tmp_path / "state", sinks=["alpha"], expected_root=tmp_path / "e"
    )
    cycle = scenario.build()
    cycle.start()
    epochs = list(range(DEFAULT_COMPACT_CHANGES_AFTER + 10))
    for e in epochs:
        assert cycle.run_epoch(e, scenario.outputs(e)) == CommitSucceeded(e)
    cycle.close()
    store = scenario.expected().tables["alpha"]
    table = store._delta()
    assert table is not None
    own = [f for f in live_files(table, name=store.uri) if f.kind == "change" and not f.merged]
    assert len(own) < DEFAULT_COMPACT_CHANGES_AFTER
    assert any(f.merged for f in live_files(table, name=store.uri))
    assert last_checkpoint(store.uri) is not None
    # The sink holds what the store holds (the epochs vacuum pruned from the
    # store's history included: the snapshot folds them in).
    held: dict[object, object] = {}
    committed = memory_harness.committed("alpha")
    assert sorted(committed) == epochs
    for e in epochs:
        held.update({r["k"]: r["v"] for r in committed[e]})
    want = {r["k"]: r["v"] for r in store.snapshot(columns=["k", "v"]).to_pylist()}
    assert held == want
