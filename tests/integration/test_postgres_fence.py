"""The Postgres fence window and the marker check, with the other party placed at named points."""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
import pytest

from reconcile.core import hooks
from reconcile.core.contract import OK, Fatal, FencedError, SinkTxnId, WriterIdentity
from sinks.postgres.client import FENCE_CHECKED
from sinks.postgres.factory import postgres_sink

pytestmark = pytest.mark.integration

PIPE = "shop"
MODES = ["transactional", "prepared"]
WRITER = WriterIdentity(PIPE, "log-1")


def make_table(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE a (k text PRIMARY KEY, v bigint, _epoch bigint)")


def bound(dsn: str, mode: str, **options: Any) -> Any:
    sink = postgres_sink(dsn, "a", mode=mode, name="orders", **options)
    sink.bind(WRITER)
    return sink


def txn(epoch: int, generation: int) -> SinkTxnId:
    return SinkTxnId(PIPE, "orders", epoch, generation)


def run(sink: Any, t: SinkTxnId, value: int = 0) -> None:
    assert sink.stage(t, [{"k": f"e{t.epoch}", "v": value}]) == OK
    assert sink.prepare(t) == OK
    assert sink.commit(t) == OK


def table(dsn: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute("SELECT k, v, _epoch FROM a ORDER BY k").fetchall()


def lock_waiters(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND query LIKE '%reconcile_fences%'"
        ).fetchone()
    return int(row[0]) if row else 0


@pytest.mark.parametrize("mode", MODES)
def test_a_takeover_inside_the_window_waits_for_the_zombies_txn(pg_db: str, mode: str) -> None:
    """A takeover between the zombie's fence check and its COMMIT cannot let it write after."""
    make_table(pg_db)
    zombie = bound(pg_db, mode)
    run(zombie, txn(0, 1))
    newer = bound(pg_db, mode)
    taken_over = threading.Event()
    takeover: list[threading.Thread] = []
    waited: list[bool] = []

    def take_over() -> None:
        newer.fence(PIPE, 2, lock_timeout_ms=60_000)
        taken_over.set()

    def takeover_lands_in_the_window() -> None:
        # The zombie passed the fence (generation 1 == fence 1) and has not
        # committed. The newer writer takes over now, from another thread.
        thread = threading.Thread(target=take_over, daemon=True)
        thread.start()
        takeover.append(thread)
        deadline = time.monotonic() + 10
        while not taken_over.is_set() and lock_waiters(pg_db) == 0:
            assert time.monotonic() < deadline, "the takeover neither waited nor finished"
            time.sleep(0.01)
        # Protected: the takeover waits for the zombie's txn (the fence row is
        # locked inside it). Unprotected, it would be done already.
        waited.append(not taken_over.is_set())

    with hooks.at(FENCE_CHECKED, takeover_lands_in_the_window) as window:
        run(zombie, txn(1, 1), value=1)  # committed before the takeover, not after it
    assert window.fired == 1
    assert waited == [True], "a takeover finished while the zombie's epoch txn was open"
    takeover[0].join(timeout=30)
    assert taken_over.is_set()
    # From now on the zombie is fenced, inside its own txn; nothing more is written.
    assert zombie.stage(txn(2, 1), [{"k": "zombie", "v": -1}]) == OK
    outcome = zombie.prepare(txn(2, 1))
    assert isinstance(outcome, Fatal) and isinstance(outcome.error, FencedError)
    run(newer, txn(2, 2), value=2)
    assert table(pg_db) == [("e0", 0, 0), ("e1", 1, 1), ("e2", 2, 2)]


@pytest.mark.parametrize("mode", MODES)
def test_a_replay_of_a_committed_epoch_never_touches_the_target(pg_db: str, mode: str) -> None:
    """The marker check stops a replay before it writes, not by a rollback after it wrote."""
    make_table(pg_db)
    with psycopg.connect(pg_db, autocommit=True) as conn:
        # nextval() is not rolled back: it counts every row the sink ever wrote.
        conn.execute(
            "CREATE SEQUENCE touches; "
            "CREATE FUNCTION touch() RETURNS trigger LANGUAGE plpgsql AS "
            "$$BEGIN PERFORM nextval('touches'); RETURN NEW; END$$; "
            "CREATE TRIGGER touch BEFORE INSERT OR UPDATE ON a "
            "FOR EACH ROW EXECUTE FUNCTION touch()"
        )
    run(bound(pg_db, mode), txn(0, 1), value=7)
    # A restarted writer replays epoch 0, with other content.
    again = bound(pg_db, mode)
    assert again.stage(txn(0, 2), [{"k": "e0", "v": 99}, {"k": "new", "v": 1}]) == OK
    assert again.prepare(txn(0, 2)) == OK and again.commit(txn(0, 2)) == OK
    with psycopg.connect(pg_db, autocommit=True) as conn:
        assert conn.execute("SELECT last_value FROM touches").fetchone() == (1,)
    assert table(pg_db) == [("e0", 7, 0)]
