"""SIGINT and SIGTERM sent to ``reconcile verify``, ``repair`` and ``watch`` as real processes.

Each command is held at a named point (``RECONCILE_HOLD_AT``, ``reconcile.core.hooks``)
or in a server statement that waits for a lock the test holds, and signalled
there with ``os.kill``. Then, from outside the process:

- its exit code is 130 (SIGINT) or 143 (SIGTERM), and it exited within a bound;
- stderr is exactly one line, no traceback, naming the step and what it wrote;
- before the repair's COMMIT, the table's rows in PostgreSQL are as they were
  and no repair was recorded; once the COMMIT was sent, the line says it is in
  doubt (a COMMIT cut short while it waits for a synchronous standby commits
  locally: "nothing was written" would be false);
- no backend of the client is left in ``pg_stat_activity``.

Each test starts a process (about 3 s of imports on a 2-core machine): the
default suite holds one per step and guarantee, the other points are ``slow``.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.cli_run import REPO
from tests.fix_pg import PgServer
from tests.recovery_setup import (
    SIMPLE_DDL,
    SIMPLE_SCHEMA,
    Setup,
    expected_rows,
    make_setup,
    sink_rows,
)

pytestmark = pytest.mark.integration

TABLE = "public.orders"
NOTHING = "nothing was written"
WROTE = f"the repair of {TABLE} had been committed; nothing else was written"
# An interactive shell's foreground job: SIGINT as Python sets it up (a runner
# started in the background would hand its children SIGINT ignored, which the
# command then rightly leaves ignored).
LAUNCH = (
    "import signal, sys\n"
    "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
    "from reconcile.cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)
EXIT = {signal.SIGINT: 130, signal.SIGTERM: 143}
STOP_S = 20  # the process ends within this after its signal (it takes about a second)


@pytest.fixture
def orders(pg_db: str, tmp_path: Path) -> Setup:
    """200 rows in two epochs, then damaged by hand: 10 rows gone, 10 changed (the brake's 10 %)."""
    return damaged(pg_db, tmp_path)


def damaged(dsn: str, root: Path) -> Setup:
    setup = make_setup(dsn, str(root), "orders", SIMPLE_SCHEMA, SIMPLE_DDL, ["id"])
    setup.write([{"id": i, "name": f"n{i}", "total": i} for i in range(150)])
    setup.write([{"id": i, "name": f"m{i}", "total": -i} for i in range(100, 200)])
    setup.execute("DELETE FROM {t} WHERE id < 10")
    setup.execute("UPDATE {t} SET total = 7 WHERE id >= 190")
    return setup


@dataclass
class Command:
    """A ``reconcile`` process, and what it printed once it ended."""

    proc: subprocess.Popen[str]
    held: Path
    code: int | None = None
    stdout: str = ""
    stderr: str = ""

    def wait_held(self, point: str) -> None:
        deadline = time.monotonic() + 120
        while not self.held.exists():
            if self.proc.poll() is not None:
                out, err = self.proc.communicate()
                pytest.fail(f"exited {self.proc.returncode} before {point}: {err or out}")
            assert time.monotonic() < deadline, f"never held at {point}"
            time.sleep(0.05)
        assert self.held.read_text().split() == [str(self.proc.pid), point]

    def signal(self, signum: int) -> None:
        os.kill(self.proc.pid, signum)
        try:
            self.stdout, self.stderr = self.proc.communicate(timeout=STOP_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()
            pytest.fail(f"still running {STOP_S} s after {signal.Signals(signum).name}")
        self.code = self.proc.returncode


@pytest.fixture
def command(tmp_path: Path) -> Iterator[Callable[..., Command]]:
    """Starts ``reconcile ARGS``, held at ``hold`` if given; kills what is left at the end."""
    started: list[Command] = []

    def start(*args: str, hold: str | None = None, swallow: bool = False) -> Command:
        held = tmp_path / f"held-{uuid.uuid4().hex[:8]}"
        env = {**os.environ, "PYTHONPATH": str(REPO), "RECONCILE_HOLD_FILE": str(held)}
        if hold is not None:
            env["RECONCILE_HOLD_AT"] = hold
        if swallow:
            env["RECONCILE_HOLD_SWALLOW"] = "1"
        proc = subprocess.Popen(
            [sys.executable, "-c", LAUNCH, *args], cwd=REPO, env=env, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        started.append(Command(proc, held))
        return started[-1]

    yield start
    for cmd in started:
        if cmd.proc.poll() is None:
            cmd.proc.kill()
            cmd.proc.communicate()


def recover_args(setup: Setup, command: str, *extra: str) -> list[str]:
    return [command, "--pg", setup.dsn, "--store", setup.root, "--pipeline", "shop",
            "--table", "orders", *extra]  # fmt: skip


def others(dsn: str, *mine: int) -> list[tuple[Any, ...]]:
    """Backends on the test's database other than the test's own (``mine``, this one)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(
            "SELECT pid, application_name, state, wait_event FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() "
            "AND pid <> ALL(%s) AND backend_type = 'client backend'",
            (list(mine),),
        ).fetchall()


def settles(check: Callable[[], bool], seconds: float = 10) -> bool:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def stopped_cleanly(cmd: Command, signum: int, line: str, dsn: str, *mine: int) -> None:
    """The exit code, exactly the one line, and no backend of the client left."""
    assert cmd.code == EXIT[signum], (cmd.code, cmd.stderr)
    assert "Traceback" not in cmd.stderr
    assert cmd.stderr.splitlines() == [line], cmd.stderr
    assert settles(lambda: not others(dsn, *mine)), others(dsn, *mine)


def unchanged(setup: Setup, before: dict[Any, Any]) -> None:
    assert sink_rows(setup) == before
    assert setup.scalar("SELECT count(*) FROM reconcile.reconcile_repairs") == 0


def interrupted(name: str, signum: int, where: str, outcome: str = NOTHING) -> str:
    return f"reconcile {name}: interrupted by {signal.Signals(signum).name} {where}; {outcome}"


# Points inside verify and repair, and the step each is in.
POINTS = {
    "recovery.pulling": "during the pull of public.orders",
    "recovery.diffing": "during the diff of public.orders",
    "pg.repair.locked": "during the repair transaction of public.orders",
    "pg.repair.applied": "during the repair transaction of public.orders",
}


@pytest.mark.parametrize(
    ("point", "signum", "mode"),
    [
        # The pull is held in the server by default (below): in Python, it is slow.
        pytest.param("recovery.pulling", signal.SIGINT, "full", marks=pytest.mark.slow),
        ("recovery.diffing", signal.SIGTERM, "buckets"),
        pytest.param("pg.repair.locked", signal.SIGTERM, "full", marks=pytest.mark.slow),
        ("pg.repair.applied", signal.SIGINT, "buckets"),
    ],
    ids=["pull-int", "diff-term", "locked-term", "applied-int"],
)
def test_a_repair_interrupted_before_its_commit_writes_nothing(
    orders: Setup, command: Callable[..., Command], point: str, signum: int, mode: str
) -> None:
    before = sink_rows(orders)
    cmd = command(*recover_args(orders, "repair", "--mode", mode), hold=point)
    cmd.wait_held(point)
    cmd.signal(signum)
    stopped_cleanly(cmd, signum, interrupted("repair", signum, POINTS[point]), orders.dsn)
    unchanged(orders, before)


@pytest.mark.parametrize(
    ("name", "mode", "signum", "step"),
    [
        ("repair", "full", signal.SIGINT, "the pull"),
        pytest.param(
            "repair", "buckets", signal.SIGTERM, "the bucket search", marks=pytest.mark.slow
        ),
        ("verify", "buckets", signal.SIGINT, "the bucket search"),
    ],
    ids=["repair-full-int", "repair-buckets-term", "verify-buckets-int"],
)
def test_a_statement_waiting_on_the_server_is_cancelled(
    orders: Setup, command: Callable[..., Command], name: str, mode: str, signum: int, step: str
) -> None:
    before = sink_rows(orders)
    locker = psycopg.connect(orders.dsn)
    try:
        # The pull's (or the checksums') statement waits behind this lock: it
        # sends nothing to its client until it ends, which it never would.
        locker.execute("LOCK TABLE orders IN ACCESS EXCLUSIVE MODE")
        cmd = command(*recover_args(orders, name, "--mode", mode))
        assert settles(
            lambda: any(
                row[3] == "relation" for row in others(orders.dsn, locker.info.backend_pid)
            ),
            120,
        ), others(orders.dsn, locker.info.backend_pid)
        cmd.signal(signum)
        # With the lock still held: the client's statement was cancelled, not
        # left waiting on the server after its client went away.
        line = interrupted(name, signum, f"during {step} of {TABLE}")
        stopped_cleanly(cmd, signum, line, orders.dsn, locker.info.backend_pid)
    finally:
        locker.rollback()
        locker.close()
    unchanged(orders, before)


def test_a_swallowed_interrupt_still_stops_the_commit(
    orders: Setup, command: Callable[..., Command]
) -> None:
    """A library that swallows the exception (as once happened) does not let the repair commit."""
    before = sink_rows(orders)
    cmd = command(*recover_args(orders, "repair", "--mode", "full"), hold="pg.repair.applied",
                  swallow=True)  # fmt: skip
    cmd.wait_held("pg.repair.applied")
    cmd.signal(signal.SIGTERM)
    line = interrupted("repair", signal.SIGTERM, POINTS["pg.repair.applied"])
    stopped_cleanly(cmd, signal.SIGTERM, line, orders.dsn)
    unchanged(orders, before)


@pytest.mark.slow
def test_an_interrupt_after_the_commit_says_the_repair_was_written(
    orders: Setup, command: Callable[..., Command]
) -> None:
    cmd = command(*recover_args(orders, "repair", "--mode", "full"), hold="pg.repair.committed")
    cmd.wait_held("pg.repair.committed")
    cmd.signal(signal.SIGINT)
    line = interrupted("repair", signal.SIGINT, f"during the repair transaction of {TABLE}", WROTE)
    stopped_cleanly(cmd, signal.SIGINT, line, orders.dsn)
    assert sink_rows(orders) == expected_rows(orders)


def test_an_interrupt_while_the_commit_waits_is_in_doubt(
    private_pg_server: PgServer, tmp_path: Path, command: Callable[..., Command]
) -> None:
    """A COMMIT cut short while it waits for a synchronous standby has committed locally."""
    dsn = private_pg_server.dsn(private_pg_server.create_database())
    setup = damaged(dsn, tmp_path)
    with private_pg_server.connect() as conn:
        conn.autocommit = True
        # A standby that never comes: every COMMIT that needs one waits for it.
        conn.execute("ALTER SYSTEM SET synchronous_standby_names = 'nobody'")
        conn.execute("SELECT pg_reload_conf()")
    cmd = command(*recover_args(setup, "repair", "--mode", "full"))
    assert settles(lambda: any(row[3] == "SyncRep" for row in others(dsn)), 120), others(dsn)
    cmd.signal(signal.SIGTERM)
    line = interrupted(
        "repair", signal.SIGTERM, f"during the COMMIT of the repair of {TABLE}",
        f"the COMMIT of the repair of {TABLE} had been sent, so whether it was written is "
        "unknown: run `reconcile verify` to see",
    )  # fmt: skip
    assert cmd.code == 143 and cmd.stderr.splitlines() == [line], cmd.stderr
    # Which is the truth here: the cancel ended the wait, and the repair stands.
    assert sink_rows(setup) == expected_rows(setup)
    # The repair's backend, its client gone, drops its temp tables on the way
    # out: a commit that waits for the standby too. Without one, it ends.
    with private_pg_server.connect() as conn:
        conn.autocommit = True
        conn.execute("ALTER SYSTEM RESET synchronous_standby_names")
        conn.execute("SELECT pg_reload_conf()")
    assert settles(lambda: not others(dsn)), others(dsn)


@pytest.mark.slow
def test_an_interrupt_at_a_seeded_point(orders: Setup, command: Callable[..., Command]) -> None:
    """A point, a signal and a mode picked from RECONCILE_CHAOS_SEED (printed to replay it)."""
    seed = int(os.environ.get("RECONCILE_CHAOS_SEED", "24"))
    rng = random.Random(seed)
    point = rng.choice(sorted(POINTS))
    signum = rng.choice([signal.SIGINT, signal.SIGTERM])
    mode = rng.choice(["full", "buckets"])
    print(f"seed {seed}: {point}, {signum.name}, mode {mode}")
    before = sink_rows(orders)
    cmd = command(*recover_args(orders, "repair", "--mode", mode), hold=point)
    cmd.wait_held(point)
    cmd.signal(signum)
    stopped_cleanly(cmd, signum, interrupted("repair", signum, POINTS[point]), orders.dsn)
    unchanged(orders, before)


def watch_config(setup: Setup, tmp_path: Path) -> str:
    config = tmp_path / "reconcile.toml"
    config.write_text(
        f"""
[store]
root = "{setup.root}"

[pipelines.shop.sinks.orders]
dsn = "{setup.dsn}"
table = "orders"
keys = ["id"]
"""
    )
    return str(config)


def test_watch_interrupted_during_a_round(
    orders: Setup, tmp_path: Path, command: Callable[..., Command]
) -> None:
    config = watch_config(orders, tmp_path)
    cmd = command("watch", "--config", config, "--every", "1s", "--mode", "full",
                  hold="recovery.diffing:2")  # fmt: skip
    cmd.wait_held("recovery.diffing")
    cmd.signal(signal.SIGINT)
    line = interrupted("watch", signal.SIGINT, f"during the diff of {TABLE}, in round 2")
    stopped_cleanly(cmd, signal.SIGINT, line, orders.dsn)
    assert cmd.stdout.startswith("[round 1] shop.orders (orders): missing 10, extra 0, changed 10")
    assert len(cmd.stdout.splitlines()) == 1


def test_watch_interrupted_between_rounds(
    orders: Setup, tmp_path: Path, command: Callable[..., Command]
) -> None:
    config = watch_config(orders, tmp_path)
    cmd = command("watch", "--config", config, "--every", "10m", "--mode", "full", "--repair")
    assert cmd.proc.stdout is not None
    first = cmd.proc.stdout.readline()  # round 1 is done and printed: the wait has begun
    assert first.startswith("[round 1] shop.orders (orders): missing 10, extra 0, changed 10, "
                            "repaired 20 rows"), first  # fmt: skip
    cmd.signal(signal.SIGTERM)
    line = interrupted("watch", signal.SIGTERM, "during the wait after round 1", WROTE)
    stopped_cleanly(cmd, signal.SIGTERM, line, orders.dsn)
    assert sink_rows(orders) == expected_rows(orders)


@pytest.mark.slow  # a Spark session of its own: half a minute here
@pytest.mark.spark
def test_a_spark_verify_interrupted_stops_its_session(
    orders: Setup, command: Callable[..., Command]
) -> None:
    point = "spark.verify.snapshot_exported"  # Spark is up, the sink's snapshot is open
    cmd = command(*recover_args(orders, "verify", "--spark", "--master", "local[1]",
                                "--partitions", "2"), hold=point)  # fmt: skip
    cmd.wait_held(point)
    cmd.signal(signal.SIGINT)
    assert cmd.code == 130, cmd.stderr[-3000:]
    assert "Traceback" not in cmd.stderr, cmd.stderr[-3000:]
    # Spark logs on stderr too; the command's own line is the last.
    assert cmd.stderr.strip().splitlines()[-1] == interrupted(
        "verify", signal.SIGINT, "during the Spark verify of orders"
    )
    assert settles(lambda: not others(orders.dsn)), others(orders.dsn)
