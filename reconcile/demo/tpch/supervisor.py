"""The demo's supervisor: Postgres, the feed, the chaos, the restarts, and the audit.

``run(options)`` is ``reconcile demo``. It starts (or is given) Postgres,
generates TPC-H, drops lineitem into the watched folder one file per
``interval``, and runs the pipeline process (``reconcile.demo.tpch.pipeline``)
until every epoch is committed: when chaos kills it (SIGKILL at a seeded
named point) or it fails, it is started again, and it resumes from Spark's
checkpoint and the expected state. With chaos, the pipeline reaches Postgres
through a proxy that drops connections around COMMIT at a seeded rate.

Everything a run needs is under the work folder (the data, the inbox, the
checkpoint, the expected state, the event log), so a demo killed whole
(supervisor, pipeline and Spark) resumes when run again with the same
``--workdir`` and ``--pg``.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from reconcile.core.contract import ConfigurationError
from reconcile.demo.tpch.data import SINK_TABLES_SQL, Feed, generate
from reconcile.demo.tpch.events import EventLog
from reconcile.demo.tpch.kafka_source import feed_source
from reconcile.demo.tpch.pipeline import KEYS, PIPELINE
from reconcile.demo.tpch.status import status_line
from reconcile.demo.tpch.summary import Summary, audit

if TYPE_CHECKING:
    pass

__all__ = [
    "KILL_POINTS", "Feeder", "Options", "launch_pipeline", "prepare_tables", "run", "run_settings"
]  # fmt: skip

# Where chaos kills the pipeline process (``reconcile.core.hooks`` points). The
# first two come first in every chaos run: they are the windows a checkpoint-
# bound sink cannot survive without holding results back.
KILL_POINTS = {
    "cycle.expected_state.recorded": "between the store commit and the sink commit",
    "pg.commit.returned": "between a sink's COMMIT and its acknowledgement",
    "cycle.decided": "after the decision, before any sink commit",
    "stream.batch_staged": "after a batch was staged, before anything is recorded",
    "stream.batch_committed": "after every sink committed, before Spark's commit log",
}
MAX_FAILURES = 5  # non-kill exits in a row before the demo gives up


@dataclass
class Options:
    """``reconcile demo``'s options (see its ``--help``)."""

    scale: float = 0.01
    epochs: int = 10
    interval: float = 1.0
    trigger: float = 0.0
    chaos: int | None = None
    crashes: int = 4
    drop_rate: float = 0.15
    pg: str | None = None
    workdir: Path | None = None
    keep: bool = False
    reset: bool = False
    master: str = "local[2,4]"
    via: str = "auto"
    progress: bool = True
    source: str = "files"  # or "kafka": lineitem through a broker the run starts


def _die_with_parent() -> None:
    """In the pipeline process: SIGKILL when the supervisor dies (a demo killed whole)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


@contextlib.contextmanager
def _postgres(options: Options, workdir: Path) -> Iterator[str]:
    """The sink database's DSN: ``--pg``, or an embedded throwaway server.

    A kept embedded server's DSN (with its password) goes into a file only its
    owner can read, ``<workdir>/embedded_pg.dsn``, never onto the terminal.
    """
    if options.pg:
        yield options.pg
        return
    from reconcile.demo.embedded_pg import start_server

    # track_commit_timestamp: each row's visible time is its txn's commit time.
    with start_server(keep=options.keep, track_commit_timestamp="on") as server:
        dsn = str(server.dsn())
        if options.keep:
            path = workdir / "embedded_pg.dsn"
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as out:
                out.write(dsn + "\n")
        yield dsn


def _check_run(workdir: Path, options: Options) -> bool:
    """Record this run's settings, or check a resumed run's; whether it is a resume."""
    state = workdir / "demo.json"
    mine = {"scale": options.scale, "epochs": options.epochs, "pg": bool(options.pg)}
    if not state.exists():
        workdir.mkdir(parents=True, exist_ok=True)
        state.write_text(json.dumps(mine))
        return False
    theirs = json.loads(state.read_text())
    if not theirs["pg"]:
        raise ConfigurationError(
            f"{workdir} holds a demo run against an embedded Postgres server, which is gone; "
            "use a fresh --workdir (a run with --pg DSN can be resumed)"
        )
    if not options.pg:
        raise ConfigurationError(f"{workdir} holds a demo run against --pg: give the same --pg")
    for key in ("scale", "epochs"):
        if theirs[key] != mine[key]:
            raise ConfigurationError(
                f"{workdir} holds a demo run with --{key} {theirs[key]}; resume it with the "
                f"same --{key}, or use a fresh --workdir"
            )
    return True


def prepare_tables(dsn: str, *, resumed: bool, reset: bool) -> None:
    """Create the sink tables; a fresh run refuses another run's rows unless ``reset``."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        if reset:
            for table in KEYS:
                conn.execute(
                    sql.SQL("DROP TABLE IF EXISTS public.{}").format(sql.Identifier(table))
                )
            # The pipeline's markers, fences and repair log, wherever the sink
            # keeps them: a fresh run's epoch 0 must not meet an old marker.
            from sinks.postgres.markers import FENCES_TABLE, MARKERS_TABLE, REPAIRS_TABLE

            found = conn.execute(
                "SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n "
                "ON n.oid = c.relnamespace WHERE c.relname = ANY(%s) AND c.relkind = 'r'",
                ([MARKERS_TABLE, FENCES_TABLE, REPAIRS_TABLE],),
            ).fetchall()
            for schema, name in found:
                conn.execute(
                    sql.SQL("DELETE FROM {} WHERE pipeline = %s").format(
                        sql.Identifier(schema, name)
                    ),
                    (PIPELINE,),
                )
        for statement in SINK_TABLES_SQL:
            conn.execute(statement.encode())
        if resumed:
            return
        for table in KEYS:
            row = conn.execute(
                sql.SQL("SELECT count(*) FROM public.{}").format(sql.Identifier(table))
            ).fetchone()
            if row and row[0]:
                raise ConfigurationError(
                    f"table public.{table} holds {row[0]} rows of another demo run; resume that "
                    "run with its --workdir, or pass --reset to drop the demo tables and the "
                    f"pipeline {PIPELINE!r}'s markers"
                )


def _via_proxy(dsn: str, port: int) -> str:
    params = conninfo_to_dict(dsn)
    params.update(host="127.0.0.1", port=str(port))
    return make_conninfo(**params)  # type: ignore[arg-type]


class Feeder(threading.Thread):
    """Drops the next epoch file every ``interval`` seconds, once the pipeline is up."""

    def __init__(self, feed: Feed, interval: float, started: threading.Event) -> None:
        super().__init__(daemon=True, name="demo-feeder")
        self.feed, self.interval, self.started = feed, interval, started
        self.stop = threading.Event()

    def run(self) -> None:
        self.started.wait()
        for part in self.feed.slices:
            if self.stop.is_set():
                return
            if self.feed.path(part.index).exists():
                continue
            self.feed.drop(part.index)
            self.stop.wait(self.interval)


class _Chaos:
    """The seeded kill plan: which point the pipeline process dies at, launch by launch."""

    def __init__(self, seed: int, budget: int) -> None:
        rng = random.Random(seed)
        first, rest = list(KILL_POINTS)[:2], list(KILL_POINTS)[2:]
        rng.shuffle(first)
        rng.shuffle(rest)
        self.order = first + rest
        self.seed, self.budget = seed, budget

    def plan(self, crashes: int, launch: int) -> tuple[str, int] | None:
        if crashes >= self.budget:
            return None
        rng = random.Random(f"{self.seed}:{launch}")
        return self.order[crashes % len(self.order)], rng.randint(1, 2)


def launch_pipeline(
    workdir: Path,
    options: Options,
    dsn: str,
    launch: int,
    kill: tuple[str, int] | None,
    role: str | None = None,
    env_extra: dict[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """Start a pipeline process (as ``role`` "main" or "standby" if given); launch numbers it."""
    env = dict(os.environ, RECONCILE_DEMO_DSN=dsn, PYSPARK_PYTHON=sys.executable)
    env.pop("RECONCILE_KILL_GATE", None)
    env.update(env_extra or {})
    env.pop("RECONCILE_KILL_AT", None)
    if kill is not None:
        (workdir / "kills").mkdir(exist_ok=True)
        env["RECONCILE_KILL_AT"] = f"{kill[0]}:{kill[1]}"
        # Spark's Python workers inherit the variable: only the first to reach
        # the point dies (they never do: the points are on the driver), and the
        # file proves the kill fired.
        env["RECONCILE_KILL_ONCE"] = str(workdir / "kills" / f"launch-{launch}")
    (workdir / "logs").mkdir(exist_ok=True)
    log = open(workdir / "logs" / f"pipeline-{launch}.log", "wb")  # noqa: SIM115
    module = "reconcile.demo.tpch.pipeline" if role is None else "reconcile.demo.tpch.ha_pipeline"
    cmd = [sys.executable, "-m", module, str(workdir), str(options.trigger), options.master,
           options.via]  # fmt: skip
    if role is not None:
        cmd.append(role)
    try:
        return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                preexec_fn=_die_with_parent)  # fmt: skip
    finally:
        log.close()


def _tail(path: Path, chars: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except FileNotFoundError:
        return ""


def run(options: Options) -> Summary:
    """Run the demo to the end (resuming a run in ``options.workdir``); its summary.

    Raises:
        ConfigurationError: bad options, a missing tool, or another run's rows.
        RuntimeError: the pipeline failed ``MAX_FAILURES`` times in a row
            without being killed (its log's tail is in the message).
    """
    own_workdir = options.workdir is None
    removed = own_workdir and not options.keep
    workdir = Path(options.workdir or tempfile.mkdtemp(prefix="reconcile-demo-")).resolve()
    try:
        summary = _run(workdir, options)
    finally:
        if removed:
            shutil.rmtree(workdir, ignore_errors=True)
    if removed:
        summary.workdir = None  # gone: a path to nothing would send the reader looking
    return summary


def run_settings(options: Options) -> dict[str, Any]:
    """The options as the summary reports them (``settings``), without the DSN.

    Without ``--chaos`` nothing is killed and no connection is dropped, so the
    chaos knobs read 0: their defaults (4 crashes, 0.15) would read as chaos
    that happened.
    """
    found = {k: str(v) if isinstance(v, Path) else v
             for k, v in asdict(options).items() if k != "pg"}  # fmt: skip
    if options.chaos is None:
        found.update(crashes=0, drop_rate=0.0)
    return found


def _run(workdir: Path, options: Options) -> Summary:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    resumed = _check_run(workdir, options)
    events = EventLog(workdir / "events.jsonl")
    console = Console(stderr=True)
    console.print(f"[bold]reconcile demo[/]: TPC-H scale {options.scale}, {options.epochs} "
                  f"epochs, work folder {workdir}" + (" (resumed)" if resumed else ""))  # fmt: skip
    shown = options.progress and console.is_terminal
    with status_line(console, shown, f"generating TPC-H scale {options.scale} (tpchgen-cli)"):
        tables = generate(workdir / "tpch", options.scale)
    source = feed_source(options.source, tables, workdir, options.epochs, resumed)
    with source as (feed, source_env), _postgres(options, workdir) as dsn:
        prepare_tables(dsn, resumed=resumed, reset=options.reset)
        proxy = None
        pipeline_dsn = dsn
        if options.chaos is not None:
            from reconcile.testing.pg_proxy import FaultProxy

            params = conninfo_to_dict(dsn)
            proxy = FaultProxy(int(params.get("port") or 5432), str(params.get("host")))
            # The sink sessions' COMMITs (the epoch txns, the repairs), where a
            # lost reply is an ambiguous commit; not the executors' staging COPY.
            proxy.chaos(options.chaos, options.drop_rate, applications=("reconcile:",))
            pipeline_dsn = _via_proxy(dsn, proxy.port)
        chaos = _Chaos(options.chaos, options.crashes) if options.chaos is not None else None
        started = threading.Event()
        feeder = Feeder(feed, options.interval, started)
        feeder.start()
        progress = Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[status]}"), console=console,
            disable=not shown,
        )  # fmt: skip
        failures = 0
        with progress:
            bar = progress.add_task("epochs", total=options.epochs, status="")
            while True:
                launch = len(events.of("launch"))
                crashes = len(events.of("crash"))
                kill = chaos.plan(crashes, launch) if chaos is not None else None
                events.write("launch", launch=launch, kill=kill)
                launched = time.time()
                proc = launch_pipeline(
                    workdir, options, pipeline_dsn, launch, kill, None, source_env
                )
                injected_before = dict(proxy.injected) if proxy else {}
                while proc.poll() is None:
                    log = list(events.read())  # one read of the log per poll
                    committed = {e["epoch"] for e in log if e["event"] == "committed"}
                    # This launch's pipeline is up (not an earlier run's, on a resume).
                    if not started.is_set() and any(
                        e["event"] == "started" and e["t"] >= launched for e in log
                    ):
                        started.set()
                    progress.update(bar, completed=len(committed),
                                    status=f"launch {launch}, crashes {crashes}")  # fmt: skip
                    time.sleep(0.3)
                if proxy is not None:
                    fired = {k: v - injected_before.get(k, 0) for k, v in proxy.injected.items()}
                    events.write("proxy", injected={k: v for k, v in fired.items() if v})
                code = proc.returncode
                kill_file = workdir / "kills" / f"launch-{launch}"
                if code == -signal.SIGKILL and kill is not None and kill_file.exists():
                    events.write("crash", launch=launch, point=kill[0], nth=kill[1],
                                 where=KILL_POINTS[kill[0]])  # fmt: skip
                    failures = 0
                    continue
                if code == 0 and events.of("finished"):
                    break
                failures += 1
                log_tail = _tail(workdir / "logs" / f"pipeline-{launch}.log")
                events.write("failed", launch=launch, code=code, log=log_tail[-1500:])
                if failures >= MAX_FAILURES:
                    raise RuntimeError(
                        f"the demo pipeline failed {failures} times in a row (exit {code}); "
                        f"last log ({workdir}/logs/pipeline-{launch}.log):\n{log_tail}"
                    )
                time.sleep(failures)  # a database that is restarting: give it time
            progress.update(bar, completed=options.epochs, status="done")
        feeder.stop.set()
        if proxy is not None:
            proxy.close()
        with status_line(console, shown, "verifying") as status:
            summary = audit(dsn, workdir, feed, events, options.epochs, step=status)
        summary.settings = run_settings(options)
        return summary
