"""Heavy sessions: what they set, and that no server backend outlives its client.

Every session of a pull, a checksum or a repair must set JIT off, a statement
timeout the server enforces and client checks, whatever the database says
(read back from inside each session). A verify run as a real process, its
query stuck behind a lock another session holds (a statement that writes
nothing to its client until it ends), is then interrupted:

- SIGKILL: the client sends nothing; the server notices the closed socket
  (``client_connection_check_interval``) and ends the backend, while the lock
  is still held;
- SIGINT (KeyboardInterrupt) and SIGTERM whose handler raises: the client
  cancels the statement and closes the session, and its backends are gone
  while the process itself is still alive.

Each is checked in ``pg_stat_activity``, by the client's application_name.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest

from reconcile.core.contract import ReconcileError
from sinks.postgres.heavy import CANCEL_WAIT_S
from sinks.postgres.sink import PostgresSink
from tests.fix_pg import PgServer
from tests.recovery_setup import SIMPLE_DDL, SIMPLE_SCHEMA, Setup, make_setup

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
SETTINGS = (
    "SELECT current_setting('jit'), current_setting('statement_timeout'), "
    "current_setting('client_connection_check_interval'), current_setting('tcp_keepalives_idle')"
)


@pytest.fixture
def orders(pg_db: str, tmp_path: Path) -> Setup:
    setup = make_setup(pg_db, str(tmp_path), "orders", SIMPLE_SCHEMA, SIMPLE_DDL, ["id"])
    setup.write([{"id": i, "name": f"n{i}", "total": i} for i in range(200)])
    return setup


def settings_of_every_session(dsn: str, **options: Any) -> dict[str, tuple[str, ...]]:
    """The settings each heavy session has, as the server reports them from inside it."""
    sink = PostgresSink(dsn, "orders", name="orders", **options)
    try:
        target = sink.recovery_target("shop", None, write=False)
        with target.snapshot(SIMPLE_SCHEMA, ["id"]) as snap:
            pull = tuple(snap.rows(SETTINGS, [])[0])
            checksums = snap._checksums.session().execute(SETTINGS).fetchone()
        # The repair writes through the sink's own session (as epochs do).
        taken = sink._sessions.take()
        try:
            repair = taken.conn.execute(SETTINGS).fetchone()
            taken.conn.rollback()
        finally:
            sink._sessions.release(taken)
    finally:
        sink.close()
    assert checksums is not None and repair is not None
    return {"pull": pull, "checksums": tuple(checksums), "repair": tuple(repair)}


def test_every_heavy_session_sets_jit_off_a_timeout_and_client_checks(
    orders: Setup, pg_server: PgServer
) -> None:
    db = psycopg.conninfo.conninfo_to_dict(orders.dsn)["dbname"]
    with pg_server.connect() as conn:
        conn.autocommit = True
        # What a database may say; the heavy sessions set their own.
        conn.execute(f'ALTER DATABASE "{db}" SET jit = on')
        conn.execute(f'ALTER DATABASE "{db}" SET client_connection_check_interval = 0')
    want = ("off", "15min", "1s", "30")
    assert settings_of_every_session(orders.dsn) == dict.fromkeys(
        ("pull", "checksums", "repair"), want
    )
    # An explicit statement timeout is the sink's; the sessions take it.
    explicit = settings_of_every_session(orders.dsn, statement_timeout_ms=1234)
    assert {s[1] for s in explicit.values()} == {"1234ms"}
    # A timeout the database sets stands (a DBA's choice); JIT stays off.
    with pg_server.connect() as conn:
        conn.autocommit = True
        conn.execute(f"ALTER DATABASE \"{db}\" SET statement_timeout = '42s'")
    kept = settings_of_every_session(orders.dsn)
    assert set(kept.values()) == {("off", "42s", "1s", "30")}


def test_the_server_ends_a_pull_at_the_statement_timeout(orders: Setup) -> None:
    sink = PostgresSink(orders.dsn, "orders", name="orders", statement_timeout_ms=300)
    locker = psycopg.connect(orders.dsn)
    try:
        locker.execute("LOCK TABLE orders IN ACCESS EXCLUSIVE MODE")
        target = sink.recovery_target("shop", None, write=False)
        started = time.monotonic()
        with (
            pytest.raises(ReconcileError, match="statement timeout"),
            target.snapshot(SIMPLE_SCHEMA, ["id"]) as snap,
        ):
            snap.pull_all(None)
        assert time.monotonic() - started < 30
    finally:
        locker.close()
        sink.close()


CLIENT = """
import signal, sys
from reconcile import recover

def stop(signum, frame):
    raise SystemExit(143)

signal.signal(signal.SIGTERM, stop)
# Python's own Ctrl-C (a parent that ignores SIGINT, as a shell does for a
# background job, would leave it ignored here).
signal.signal(signal.SIGINT, signal.default_int_handler)
try:
    recover(sys.argv[1], sys.argv[2], "shop", "orders", mode=sys.argv[3], dry_run=True)
except BaseException as err:
    print("interrupted:", type(err).__name__, flush=True)
    sys.stdin.read()  # alive, until the test closes stdin
"""


def backends(dsn: str, app: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(
            "SELECT pid, state, wait_event_type FROM pg_stat_activity WHERE application_name = %s",
            (app,),
        ).fetchall()


def wait_for(check: Any, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize(
    ("mode", "signum"),
    [
        ("full", signal.SIGKILL),
        ("buckets", signal.SIGINT),
        ("full", signal.SIGTERM),
        ("buckets", signal.SIGTERM),
    ],
    ids=["full-kill", "buckets-int", "full-term", "buckets-term"],
)
def test_no_backend_outlives_an_interrupted_verify(
    orders: Setup, mode: str, signum: signal.Signals
) -> None:
    app = f"verify-{uuid.uuid4().hex[:8]}"
    locker = psycopg.connect(orders.dsn)
    # The verify's query on the table waits behind this lock: it writes
    # nothing to its client until it ends, which it never would by itself.
    locker.execute("LOCK TABLE orders IN ACCESS EXCLUSIVE MODE")
    client = subprocess.Popen(
        [sys.executable, "-c", CLIENT, f"{orders.dsn} application_name={app}", orders.root, mode],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert wait_for(lambda: any(row[2] == "Lock" for row in backends(orders.dsn, app)), 60), (
            "the verify's query never waited for the lock"
        )
        client.send_signal(signum)
        # Well within the time a statement is waited for after its cancel: the
        # backends end because the client cancelled and closed (or, killed,
        # because the server noticed), not because it gave up waiting.
        assert wait_for(lambda: not backends(orders.dsn, app), CANCEL_WAIT_S - 2), backends(
            orders.dsn, app
        )
        if signum == signal.SIGKILL:
            assert client.wait(10) == -signal.SIGKILL
        else:
            assert client.poll() is None  # still alive: its own cancel ended the backends
            assert client.stdout is not None
            line = client.stdout.readline().strip()
            assert line == (
                "interrupted: KeyboardInterrupt"
                if signum == signal.SIGINT
                else "interrupted: SystemExit"
            )
    finally:
        locker.rollback()
        locker.close()
        if client.poll() is None:
            assert client.stdin is not None
            client.stdin.close()
            client.wait(30)
