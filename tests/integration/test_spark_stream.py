"""Exactly-once Structured Streaming into PostgreSQL: a real Spark driver killed by SIGKILL.

Each test runs ``tests.spark_stream_pipeline`` (three micro-batches, two sink
tables, an expected state) in a subprocess, kills it at a named point of
micro-batch 1, runs it again on the same Spark checkpoint, and then reads
what PostgreSQL holds: every input row exactly once under the epoch of its
batch, the per-batch totals, one marker per sink and epoch, the sink equal to
the expected state, and, because the pipeline stamps each run's tag into its
rows (a transform that is not deterministic on replay), which run's rows of
batch 1 won.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest

from expected_state.store import ExpectedStateStore

# Most tests run the pipeline twice in a subprocess (a JVM each time): minutes when loaded.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
BATCHES = 3
ROWS = 60  # per batch
CUSTOMERS = 7


def amount(i: int) -> Decimal:
    return (Decimal(i) * Decimal("1.25")).quantize(Decimal("0.01"))


def make_inbox(root: Path) -> None:
    """File b holds ids b*ROWS .. b*ROWS+ROWS-1; older files first, one per micro-batch."""
    inbox = root / "inbox"
    inbox.mkdir(parents=True)
    start = time.time() - 100
    for b in range(BATCHES):
        path = inbox / f"batch-{b}.json"
        with path.open("w") as out:
            for i in range(b * ROWS, (b + 1) * ROWS):
                out.write(
                    json.dumps({"id": i, "customer": i % CUSTOMERS, "amount": float(amount(i))})
                )
                out.write("\n")
        os.utime(path, (start + b, start + b))


def run_pipeline(
    dsn: str,
    root: Path,
    tag: str,
    *,
    env: dict[str, str] | None = None,
    master: str = "local[2]",
    form: str = "write_stream",
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tests.spark_stream_pipeline", dsn, str(root), tag, master, form],
        cwd=REPO,
        env={
            **os.environ,
            "PYSPARK_PYTHON": sys.executable,
            "PYTHONPATH": str(REPO),  # Spark's Python workers import the build function
            **(env or {}),
        },
        capture_output=True,
        text=True,
        timeout=600,
    )


def run_killed(
    dsn: str, root: Path, point: str, nth: int = 1, *, form: str = "write_stream"
) -> subprocess.CompletedProcess[str]:
    """Run 1 of the pipeline (tag r1), killed at the ``nth`` hit of ``point``; assert it fired."""
    fired = root / "killed"
    killed = run_pipeline(
        dsn, root, "r1", form=form,
        env={"RECONCILE_KILL_AT": f"{point}:{nth}", "RECONCILE_KILL_ONCE": str(fired)},
    )  # fmt: skip
    assert killed.returncode != 0, killed.stderr[-3000:]
    assert fired.read_text().split()[1] == point  # the fault fired, there
    return killed


def summary(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert proc.returncode == 0, proc.stderr[-3000:]
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def check_exactly_once(
    dsn: str, root: Path, winners: dict[int, str], *, sinks: tuple[str, ...] = ("events", "totals")
) -> None:
    """What PostgreSQL holds, against a model of the input and against the expected state."""
    with psycopg.connect(dsn) as conn:
        events = conn.execute("SELECT id, customer, amount, run, _epoch FROM events").fetchall()
        totals = conn.execute("SELECT customer, amount, n, _epoch FROM totals").fetchall()
        markers = conn.execute(
            "SELECT sink, epoch FROM reconcile.reconcile_commits WHERE pipeline = 'shop'"
        ).fetchall()
    ids = [row[0] for row in events]
    assert len(ids) == len(set(ids)) == BATCHES * ROWS  # none lost, none twice
    model_events = {
        (i, i % CUSTOMERS, amount(i), winners[i // ROWS], i // ROWS) for i in range(BATCHES * ROWS)
    }
    assert set(events) == model_events  # every row under its own epoch, from the winning run
    last = BATCHES - 1
    model_totals = {
        (
            c,
            sum((amount(i) for i in range(last * ROWS, BATCHES * ROWS) if i % CUSTOMERS == c),
                Decimal(0)),
            sum(1 for i in range(last * ROWS, BATCHES * ROWS) if i % CUSTOMERS == c),
            last,
        )
        for c in range(CUSTOMERS)
    }  # fmt: skip
    assert set(totals) == (model_totals if "totals" in sinks else set())
    assert sorted(markers) == sorted((s, e) for s in sinks for e in range(BATCHES))
    # The sink equals what the store says it must hold (the store's own rows).
    store = ExpectedStateStore(str(root / "store"), "shop", "events", ["id"]).snapshot()
    expected = set(
        zip(
            *(store.column(c).to_pylist() for c in ("id", "customer", "amount", "run")), strict=True
        )
    )
    assert expected == {row[:4] for row in events}


def staging_tables(dsn: str) -> dict[str, tuple[int, int]]:
    """Each Postgres staging table: (rows it holds now, rows ever inserted into it)."""
    with psycopg.connect(dsn) as conn:
        found = conn.execute(
            "SELECT schemaname, relname, n_tup_ins FROM pg_stat_user_tables "
            "WHERE relname LIKE '\\_reconcile\\_stage\\_%'"
        ).fetchall()
        # In the engine's own schema, never beside the target.
        assert {schema for schema, _, _ in found} <= {"reconcile"}, found
        return {
            name: (conn.execute(f'SELECT count(*) FROM reconcile."{name}"').fetchone()[0], int(ins))
            for _, name, ins in found
        }


def store_parts(root: Path, sink: str, epoch: int) -> int:
    """How many change files the store's Delta log lists for ``epoch`` of ``sink``."""
    from deltalake import DeltaTable

    return sum(
        1
        for path in DeltaTable(str(root / "store" / "shop" / sink)).file_uris()
        if Path(path).name.startswith(f"change-e{epoch:012d}-")
    )


WAYS = {"write_stream": "executors", "driver": "driver", "auto": "collect"}


@pytest.mark.parametrize("form", ["write_stream", "driver", "auto"])
@pytest.mark.spark  # in a subprocess
def test_a_clean_run_writes_every_batch_once_and_a_rerun_writes_nothing(
    pg_db: str, tmp_path: Path, form: str
) -> None:
    make_inbox(tmp_path)
    first = summary(run_pipeline(pg_db, tmp_path, "r1", form=form))
    assert first["committed"] == list(range(BATCHES))
    # Each batch's staging and commit were timed (the demo and benchmark report them).
    assert [b for b, _, _ in first["timed"]] == list(range(BATCHES))
    assert all(stage > 0 and commit > 0 for _, stage, commit in first["timed"]), first["timed"]
    # Each sink's rows took the way the form asks for, in every batch.
    way = WAYS[form]
    assert first["via"] == [{"events": way, "totals": way}] * BATCHES, first["via"]
    check_exactly_once(pg_db, tmp_path, {0: "r1", 1: "r1", 2: "r1"})
    again = summary(run_pipeline(pg_db, tmp_path, "r2", form=form))  # nothing new in the inbox
    assert again["committed"] == []
    check_exactly_once(pg_db, tmp_path, {0: "r1", 1: "r1", 2: "r1"})
    stages = staging_tables(pg_db)
    if form in ("driver", "auto"):
        staged = tmp_path / "staging" / "shop"
        assert not staged.exists() or not list(staged.iterdir())  # nothing staged is left
        if form == "driver":
            assert stages == {}  # never planned: no staging table
        else:  # planned (made, and swept at the first batch), never written
            assert sorted(stages.values()) == [(0, 0), (0, 0)]
        # The driver wrote each epoch's changes as one file of the store.
        assert [store_parts(tmp_path, "events", e) for e in range(BATCHES)] == [1] * BATCHES
        return
    # The executors wrote the rows: into one staging table per sink (every
    # row of the three batches went in; none is left), and as two store
    # change files per epoch (one per task), which one commit added.
    assert sorted(stages.values()) == [(0, CUSTOMERS * BATCHES), (0, ROWS * BATCHES)]
    assert [store_parts(tmp_path, "events", e) for e in range(BATCHES)] == [2] * BATCHES


# point of micro-batch 1 (its second hit) -> whose rows batch 1 ends with
KILLS = {
    # staged on the executors, nothing recorded: the re-run is the only run
    "stream.batch_staged": "r2",
    # recorded in the store, never decided: start() reverts it; the re-run wins
    "cycle.expected_state.recorded": "r2",
    # decided, the open sink transactions died with the driver: the sinks are
    # given the RECORDED rows, never the re-run's
    "cycle.decided": "r1",
    # in every sink, Spark's commit log not written: Spark re-runs the batch,
    # and the cycle finds it finalized (a no-op)
    "stream.batch_committed": "r1",
}


@pytest.mark.chaos
@pytest.mark.parametrize("form", ["write_stream", "auto"])
@pytest.mark.parametrize("point", sorted(KILLS))
@pytest.mark.spark  # in a subprocess
def test_driver_killed_mid_batch_resumes_exactly_once(
    pg_db: str, tmp_path: Path, point: str, form: str
) -> None:
    make_inbox(tmp_path)
    assert run_killed(pg_db, tmp_path, point, 2, form=form).returncode == -9
    resumed = summary(run_pipeline(pg_db, tmp_path, "r2", form=form))
    way = WAYS[form]
    assert all(v == {"events": way, "totals": way} for v in resumed["via"] if v), resumed["via"]
    winner = KILLS[point]
    check_exactly_once(pg_db, tmp_path, {0: "r1", 1: winner, 2: "r2"})
    if point == "stream.batch_committed":
        assert resumed["replayed"] == [1] and resumed["committed"] == [1, 2]
    else:
        assert 1 in resumed["committed"] and 2 in resumed["committed"]


@pytest.mark.chaos
@pytest.mark.spark  # in a subprocess
def test_a_dead_drivers_staged_rows_are_swept_when_the_next_run_collects(
    pg_db: str, tmp_path: Path
) -> None:
    """Staged on the executors, then killed; resumed with ``via="auto"``, which collects."""
    make_inbox(tmp_path)
    assert run_killed(pg_db, tmp_path, "stream.batch_staged", 2).returncode == -9
    left = staging_tables(pg_db)
    assert sum(now for now, _ in left.values()) == ROWS + CUSTOMERS  # batch 1, never committed
    resumed = summary(run_pipeline(pg_db, tmp_path, "r2", form="auto"))
    assert resumed["via"][0] == {"events": "collect", "totals": "collect"}
    check_exactly_once(pg_db, tmp_path, {0: "r1", 1: "r2", 2: "r2"})
    assert all(now == 0 for now, _ in staging_tables(pg_db).values())  # the dead run's, swept


@pytest.mark.chaos
@pytest.mark.parametrize("form", ["write_stream", "driver"])
@pytest.mark.spark  # in a subprocess
def test_an_executor_killed_after_staging_its_file_is_retried_and_counted_once(
    pg_db: str, tmp_path: Path, form: str
) -> None:
    """A task attempt that staged its rows and died: its retry stages them again; one counts."""
    make_inbox(tmp_path)
    fired = tmp_path / "killed"
    result = summary(
        run_pipeline(
            pg_db,
            tmp_path,
            "r1",
            env={"RECONCILE_KILL_AT": "stream.partition_staged", "RECONCILE_KILL_ONCE": str(fired)},
            master="local[2,4]",  # up to 4 attempts per task
            form=form,
        )
    )
    pid, point = fired.read_text().split()
    assert point == "stream.partition_staged" and int(pid) > 0  # a Python worker died there
    assert result["committed"] == list(range(BATCHES)) and result["restarts"] == 0
    check_exactly_once(pg_db, tmp_path, {0: "r1", 1: "r1", 2: "r1"})
    if form == "write_stream":
        # The dead attempt had COPied its rows (committed) before it died: the
        # staging tables received more rows than the batches hold, and the
        # epoch took only the kept attempts' (none is left after the sweep).
        stages = staging_tables(pg_db).values()
        assert sum(ins for _, ins in stages) > (ROWS + CUSTOMERS) * BATCHES
        assert all(now == 0 for now, _ in stages)


@pytest.mark.spark  # in a subprocess
def test_format_reconcile_writes_every_batch_once(pg_db: str, tmp_path: Path) -> None:
    """``df.writeStream.format("reconcile")``: executors write, Spark's commit runs the cycle."""
    make_inbox(tmp_path)
    done = run_pipeline(pg_db, tmp_path, "r1", form="format")
    assert done.returncode == 0, done.stderr[-3000:]
    check_exactly_once(pg_db, tmp_path, {0: "r1", 1: "r1", 2: "r1"}, sinks=("events",))
    assert not (tmp_path / "staging" / "format").exists()  # nothing staged is left


@pytest.mark.chaos
@pytest.mark.spark  # in a subprocess
def test_format_reconcile_commit_process_killed_after_the_decision(
    pg_db: str, tmp_path: Path
) -> None:
    """Spark's commit process dies after batch 0 is decided; the restarted query settles it."""
    make_inbox(tmp_path)
    run_killed(pg_db, tmp_path, "cycle.decided", form="format")  # the query failed with its commit
    resumed = run_pipeline(pg_db, tmp_path, "r2", form="format")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    # Batch 0 was decided by the killed run: its recorded rows are what the sink gets.
    check_exactly_once(pg_db, tmp_path, {0: "r1", 1: "r2", 2: "r2"}, sinks=("events",))


@pytest.mark.chaos
@pytest.mark.parametrize("via", ["auto", "executors"])
@pytest.mark.parametrize("fault", ["drop_after_commit", "drop_before_commit"])
def test_an_ambiguous_commit_in_a_micro_batch_is_settled_by_the_database(
    spark: Any, pg_server: Any, tmp_path: Path, fault: str, via: str
) -> None:
    """Micro-batch 1's COMMIT loses its connection (before or after the server got it)."""
    from pyspark.sql import functions as F

    from reconcile import CommitCycle
    from reconcile.core import hooks
    from reconcile.engine.expected import ExpectedState
    from reconcile.spark.stream import BATCH_STAGED, write_stream
    from reconcile.testing.pg_proxy import FaultProxy
    from sinks.postgres.factory import postgres_sink
    from tests.spark_stream_pipeline import SCHEMA, TABLES

    make_inbox(tmp_path)
    dsn = pg_server.dsn(pg_server.create_database())
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(TABLES)  # type: ignore[arg-type]
    proxy = FaultProxy(pg_server.port)
    through = conninfo_port(dsn, proxy.port)

    def build() -> CommitCycle:
        expected = ExpectedState(str(tmp_path / "store"), "shop", {"events": ["id"]})
        return CommitCycle("shop", [postgres_sink(through, "events", name="events")],
                           expected_state=expected)  # fmt: skip

    frame = (
        spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1)
        .json(str(tmp_path / "inbox")).withColumn("run", F.lit("r1"))
    )  # fmt: skip
    try:
        with hooks.at(BATCH_STAGED, lambda: proxy.arm(fault), nth=2) as arming:
            query = write_stream(
                frame, build, checkpoint=tmp_path / "checkpoint", staging=tmp_path / "staging",
                trigger={"availableNow": True}, via=via,
            )  # fmt: skip
            query.awaitTermination()
            query.reconcile_writer.close()
    finally:
        proxy.close()
    assert arming.fired == 1 and proxy.fired.is_set()  # the COMMIT of batch 1 was cut
    way = "collect" if via == "auto" else "executors"
    assert [b.via for b in query.reconcile_writer.history] == [{"events": way}] * BATCHES
    check_exactly_once(dsn, tmp_path, {0: "r1", 1: "r1", 2: "r1"}, sinks=("events",))


def conninfo_port(dsn: str, port: int) -> str:
    """``dsn`` with another port (the fault proxy's)."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    params = conninfo_to_dict(dsn)
    params["port"] = str(port)
    params["host"] = "127.0.0.1"
    return make_conninfo(**params)
