"""The leadership lease on a real Postgres: one holder, expiry in the database's clock, tenures."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import psycopg
import pytest

from reconcile.core.contract import ConfigurationError, RetryableError
from reconcile.core.lease import wait_s
from sinks.postgres.lease import MAX_TERM_S, PgLease


def test_one_holder_then_the_other_after_expiry(pg_db: str) -> None:
    a = PgLease(pg_db, "p", term_s=0.5, holder="a")
    b = PgLease(pg_db, "p", term_s=0.5, holder="b")
    first = a.try_acquire()
    assert first is not None and first.holder == "a" and first.tenure == 1
    assert a.held()
    assert b.try_acquire() is None, "a live lease was taken by another holder"
    assert not b.held()
    # Taking our own live lease again keeps the tenure.
    again = a.try_acquire()
    assert again is not None and again.tenure == 1
    seen = b.current()
    assert seen is not None and seen.holder == "a" and not seen.expired
    assert 0 < wait_s(seen, 10.0) <= 0.52
    # a stops renewing: its term runs out in the database's clock.
    time.sleep(0.6)
    assert not a.held(), "held() must turn false on our own clock once the term is over"
    taken = b.try_acquire()
    assert taken is not None and taken.holder == "b" and taken.tenure == 2
    # a's renewal of the lost tenure is refused, even though it had the row before.
    assert not a.renew()
    assert a.tenure is None
    row = (
        psycopg.connect(pg_db)
        .execute("SELECT holder, tenure FROM reconcile.reconcile_leases WHERE pipeline = 'p'")
        .fetchone()
    )
    assert row == ("b", 2)
    for lease in (a, b):
        lease.close()


def test_an_expired_lease_is_not_renewed_even_if_nobody_took_it(pg_db: str) -> None:
    a = PgLease(pg_db, "q", term_s=0.3, holder="a")
    assert a.try_acquire() is not None
    assert a.renew()
    time.sleep(0.4)
    assert not a.renew(), "a holder away longer than its term must take the lease anew"
    again = a.try_acquire()
    assert again is not None and again.tenure == 2
    a.close()


def test_release_lets_a_standby_take_over_at_once(pg_db: str) -> None:
    a = PgLease(pg_db, "r", term_s=30, holder="a")
    b = PgLease(pg_db, "r", term_s=30, holder="b")
    assert a.try_acquire() is not None
    assert b.try_acquire() is None
    a.release()
    assert not a.held()
    taken = b.try_acquire()
    assert taken is not None and taken.tenure == 2
    a.close()
    b.close()


def test_racing_standbys_exactly_one_wins(pg_db: str) -> None:
    """Eight instances try for one expired lease at the same moment: exactly one wins."""
    first = PgLease(pg_db, "race", term_s=0.2, holder="old")
    assert first.try_acquire() is not None
    first.close()
    time.sleep(0.3)
    racers = [PgLease(pg_db, "race", term_s=5, holder=f"s{i}") for i in range(8)]
    for lease in racers:
        lease.current()  # connected, so that the race is on the statement, not the connect
    barrier = threading.Barrier(len(racers))
    won: list[str] = []
    unanswered: list[str] = []

    def race(lease: PgLease) -> None:
        barrier.wait()
        # A statement that ran out of its time limit (half a term, on a loaded
        # machine, queued behind the others' row lock) is retried, as a standby
        # does on its next round: only definite answers count.
        for _ in range(20):
            try:
                if lease.try_acquire() is not None:
                    won.append(lease.holder)
                return
            except RetryableError:
                continue
        unanswered.append(lease.holder)

    threads = [threading.Thread(target=race, args=(lease,)) for lease in racers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert unanswered == [] and len(won) == 1, (won, unanswered)
    row = (
        psycopg.connect(pg_db)
        .execute("SELECT holder, tenure FROM reconcile.reconcile_leases WHERE pipeline = 'race'")
        .fetchone()
    )
    assert row == (won[0], 2)
    for lease in racers:
        lease.close()


def test_bad_settings_and_an_unreachable_database() -> None:
    for bad in (0, -1.0, float("nan"), float("inf"), MAX_TERM_S * 1.001):
        with pytest.raises(ConfigurationError, match="term"):
            PgLease("host=localhost", "p", term_s=bad)
    lease = PgLease("host=127.0.0.1 port=9 user=x password=sekret dbname=x", "p", term_s=1)
    with pytest.raises(RetryableError) as caught:
        lease.try_acquire()
    assert "sekret" not in str(caught.value)
    assert not lease.held()


def test_no_generation_is_claimed_without_the_lease(pg_db: str, tmp_path: Path) -> None:
    """A holder whose term ran out (paused, say) claims nothing in the store."""
    from expected_state.progress_log import StoreProgressLog
    from reconcile.ha.takeover import LeadershipLostError, _LeasedProgress

    store = str(tmp_path / "store")
    lease = PgLease(pg_db, "g", term_s=1.5, holder="a")
    guarded = _LeasedProgress(StoreProgressLog(store, "g"), lease)
    assert lease.try_acquire() is not None
    assert guarded.claim_generation() == 1
    time.sleep(1.6)  # the term runs out: as after a SIGSTOP
    with pytest.raises(LeadershipLostError):
        guarded.claim_generation()
    other = PgLease(pg_db, "g", term_s=5, holder="b")
    assert other.try_acquire() is not None
    # The store (read afresh from disk) still has generation 1: nothing was claimed.
    assert StoreProgressLog(store, "g").claim_generation() == 2
    lease.close()
    other.close()


def _end_session_of(dsn: str, application_name: str) -> int:
    """End the holder's lease session(s), as Postgres does when the holder's process is killed."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        pids = [r[0] for r in conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (application_name,)
        ).fetchall()]  # fmt: skip
        for pid in pids:
            conn.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,))
    return len(pids)


def test_a_holder_whose_session_is_gone_is_taken_over_before_its_term(pg_db: str) -> None:
    a = PgLease(pg_db, "gone", term_s=30, holder="a")
    b = PgLease(pg_db, "gone", term_s=30, holder="b")
    assert a.try_acquire() is not None
    # Alive: its session is open. Not renewed for longer than half a term is
    # not enough: a paused holder keeps its session, and waits for its term.
    # A term of 6 s, slept past its half: nearly 3 s of margin before it runs out, which a
    # loaded machine's connect and statement need (0.2 s of margin was not always enough).
    paused = PgLease(pg_db, "paused", term_s=6.0, holder="a")
    assert paused.try_acquire() is not None
    time.sleep(3.2)
    assert PgLease(pg_db, "paused", term_s=6.0, holder="b").try_acquire() is None, (
        "a live holder's lease was taken before its term ran out"
    )
    # a's process dies: its session ends. Half a term after its last renewal
    # the lease is free, though its 30 s term has far to run.
    assert _end_session_of(pg_db, "reconcile-lease:gone") == 1
    assert b.try_acquire() is None, "taken at once, while a holder may just be reconnecting"
    # Half a term, 0.5 s, from a's renewal; also b2's statement timeout, which a
    # loaded server meets at a tenth of a second.
    b2 = PgLease(pg_db, "gone", term_s=1.0, holder="b")
    time.sleep(0.6)
    # Half of *b2's* term is the grace: a's last renewal is older than that.
    taken = b2.try_acquire()
    assert taken is not None and taken.holder == "b" and taken.tenure == 2
    # Had a merely lost its connection, it learns it lost the lease: the first
    # statement finds the connection ended, the next is refused.
    with pytest.raises(RetryableError):
        a.renew()
    assert not a.renew(), "the renewal of a lease taken over must be refused"
    for lease in (a, b, b2, paused):
        lease.close()


def test_two_standby_processes_race_for_one_lease_exactly_one_wins(pg_db: str) -> None:
    """Two standby processes try for an expired lease at the same instant, five times over."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, RECONCILE_TEST_DSN=pg_db)
    for round_ in range(5):
        pipeline = f"race2_{round_}"
        # A one-second term: its statement timeout (half of it) is not one a loaded
        # server meets, and the term has run out when the racers start.
        old = PgLease(pg_db, pipeline, term_s=1.0, holder="old")
        assert old.try_acquire() is not None
        old.close()  # its session gone and its term run out: the lease is free
        start_at = time.time() + 2.0  # both are connected and waiting by then
        racers = [subprocess.Popen([sys.executable, "-m", "tests.ha_racer", pipeline, f"s{i}",
                                    str(start_at)], env=env, stdout=subprocess.PIPE, text=True)
                  for i in range(2)]  # fmt: skip
        said = [p.communicate(timeout=60)[0].strip() for p in racers]
        assert all(p.returncode == 0 for p in racers), said
        assert sorted(said) == ["lost", "won"], f"round {round_}: {said}"
        winner = f"s{said.index('won')}"
        with psycopg.connect(pg_db) as conn:
            row = conn.execute(
                "SELECT holder, tenure FROM reconcile.reconcile_leases WHERE pipeline = %s",
                (pipeline,),
            ).fetchone()
        assert row == (winner, 2), f"round {round_}: the row says {row}, the racers {said}"


def _lease_pid(dsn: str, pipeline: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s",
            (f"reconcile-lease:{pipeline}",),
        ).fetchall()
    assert len(rows) == 1, rows
    return int(rows[0][0])


@pytest.mark.parametrize("statement", ["renew", "try_acquire"])
def test_a_term_counts_from_before_its_statement_was_sent(pg_db: str, statement: str) -> None:
    """A renewal that waits on the row is held for a term from when it was sent, not answered.

    The database sets the new expiry when the statement runs, after its wait:
    counted from the answer instead, the holder would believe it leads for as
    long as the wait after its row ran out for everyone else.
    """
    lease = PgLease(pg_db, "slow", term_s=4.0, holder="a")
    assert lease.try_acquire() is not None
    pid = _lease_pid(pg_db, "slow")
    blocker = psycopg.connect(pg_db)
    blocker.execute("SELECT 1 FROM reconcile.reconcile_leases WHERE pipeline = 'slow' FOR UPDATE")
    released: list[float] = []

    def release_once_waiting() -> None:
        with psycopg.connect(pg_db, autocommit=True) as conn:
            while not conn.execute(
                "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s", (pid,)
            ).fetchone()[0]:  # type: ignore[index]
                time.sleep(0.01)
        released.append(time.monotonic())  # the statement was sent before this
        blocker.rollback()

    thread = threading.Thread(target=release_once_waiting)
    thread.start()
    try:
        if statement == "renew":
            assert lease.renew()
        else:
            assert lease.try_acquire() is not None
    finally:
        thread.join(10)
        blocker.close()
    assert released, "the statement never waited on the row"
    assert lease.held() and lease.held_until < released[0] + lease.term_s
    lease.close()


def test_a_renewal_records_the_session_it_came_from(pg_db: str) -> None:
    """A holder that reconnected is alive: its new session is the row's, not the ended one."""
    a = PgLease(pg_db, "moved", term_s=30, holder="a")
    assert a.try_acquire() is not None
    assert _end_session_of(pg_db, "reconcile-lease:moved") == 1  # its connection drops
    with pytest.raises(RetryableError):
        a.renew()  # finds the connection ended
    assert a.renew()  # on a new one
    with psycopg.connect(pg_db) as conn:
        row = conn.execute(
            "SELECT backend_pid FROM reconcile.reconcile_leases WHERE pipeline = 'moved'"
        ).fetchone()
    assert row == (_lease_pid(pg_db, "moved"),)
    # So a standby whose grace (half its term) has passed since a's renewal
    # still finds a's session, and waits for the term.
    b = PgLease(pg_db, "moved", term_s=0.2, holder="b")
    time.sleep(0.15)
    assert b.try_acquire() is None, "a live holder that reconnected was taken over as gone"
    for lease in (a, b):
        lease.close()


def test_a_holder_row_without_a_session_is_not_taken_as_gone(pg_db: str) -> None:
    """A NULL ``backend_pid`` (a row from before the column was filled) waits for its term."""
    a = PgLease(pg_db, "nopid", term_s=30, holder="a")
    assert a.try_acquire() is not None
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute(
            "UPDATE reconcile.reconcile_leases SET backend_pid = NULL, "
            "renewed_at = renewed_at - interval '1 minute' WHERE pipeline = 'nopid'"
        )
    b = PgLease(pg_db, "nopid", term_s=2.0, holder="b")  # a statement timeout of 1 s
    assert b.try_acquire() is None, "a lease whose session is unknown was taken before its term"
    for lease in (a, b):
        lease.close()


def test_the_longest_term_is_one_the_database_takes(pg_db: str) -> None:
    """At MAX_TERM_S, half a term is still a statement timeout PostgreSQL accepts."""
    lease = PgLease(pg_db, "long", term_s=MAX_TERM_S, holder="a")
    state = lease.try_acquire()
    assert state is not None and MAX_TERM_S - 60 < state.remaining_s <= MAX_TERM_S
    assert lease.renew() and lease.held()
    lease.close()
