"""High availability with real processes: a main and a standby of the TPC-H demo pipeline.

The leader is killed (SIGKILL at a named point it reaches itself, between
the store commit and the sink commit first), then paused (SIGSTOP past its
lease, then SIGCONT), then killed again. Each time another process must take
over, and at the end Postgres must hold every line once under the epoch of
its file and the exact TPC-H totals (``tests.demo_checks``), and the paused
main must have stepped down without writing a marker after the fault.
"""

from __future__ import annotations

import os
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from reconcile.demo.tpch.failover import FailoverOptions, run_failovers
from tests.demo_checks import assert_sinks_exact
from tests.fix_pg import markers_table

# Two HA nodes, each a Spark pipeline, killed and paused in turn over 40 epochs: over two
# minutes alone, more than the default limit beside CI's other steps.
pytestmark = [
    pytest.mark.integration,
    pytest.mark.chaos,
    pytest.mark.slow,
    pytest.mark.timeout(1200),
]

SEED = int(os.environ.get("RECONCILE_CHAOS_SEED", "1")) % 1000
EPOCHS = 40


def _generations(dsn: str) -> list[int]:
    with psycopg.connect(dsn) as conn:
        table = markers_table(conn)
        assert table is not None
        rows = conn.execute(
            sql.SQL("SELECT DISTINCT generation FROM {} WHERE pipeline = 'demo' ORDER BY 1").format(
                table
            )
        ).fetchall()
    return [r[0] for r in rows]


@pytest.mark.spark  # in a subprocess
def test_kill_pause_kill_the_leader_nothing_lost_or_doubled(pg_db: str, tmp_path: Path) -> None:
    workdir = tmp_path / "ha"
    # Every kill at a named point, the first between the store commit and the
    # sink commit (a kill from outside at a random moment: the benchmark's).
    run = run_failovers(FailoverOptions(workdir, pg_db, failovers=3, fault="mixed", seed=SEED,
                                        epochs=EPOCHS, outside_share=0.0,
                                        timeout_s=900))  # fmt: skip
    first, pause, last = run.failovers
    # The faults happened where planned: a kill is named after its point only
    # if the dying process wrote its kill file there.
    assert first.fault == "kill at cycle.expected_state.recorded"
    assert pause.fault == "pause"
    assert last.fault.startswith("kill at ")
    for done in run.failovers:
        assert done.new_pid is not None and done.new_pid != done.old_pid
        assert done.new_generation is not None and done.old_generation is not None
        assert done.new_generation > done.old_generation
        assert done.takeover_s is not None and done.takeover_s > 0
    # Leadership went from process to process: each fault hit the leader the
    # last takeover made, so the roles alternated.
    assert pause.old_pid == first.new_pid and last.old_pid == pause.new_pid
    # The paused main woke, stepped down, and no marker of its generation was
    # committed after the fault (Postgres's own commit times).
    assert pause.stepped_down is True
    assert pause.old_wrote_after == 0
    # Every process ended by a fault or cleanly: none crashed on its own.
    assert run.unexpected_exits == []
    summary = run.summary
    assert summary is not None
    assert summary.verified and (summary.missing, summary.extra, summary.changed) == (0, 0, 0)
    assert_sinks_exact(pg_db, workdir, EPOCHS)
    assert len(_generations(pg_db)) >= 4  # every leader committed under its own generation
