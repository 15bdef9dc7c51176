"""Markers belong to one target and one progress log; start() connects and checks the target.

Every test goes through CommitCycle + FileProgressLog + the real sink, and
counts rows in Postgres itself.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from reconcile.core import hooks
from reconcile.core.contract import (
    OK,
    ConfigurationError,
    Fatal,
    MarkerMismatchError,
    RetryableError,
    SinkTxnId,
    WriterIdentity,
)
from reconcile.engine.cycle import CommitCycle, CommitFatal, CommitSucceeded
from reconcile.engine.progress_file import FileProgressLog, read_progress
from sinks.postgres.client import FENCE_CHECKED
from sinks.postgres.factory import postgres_sink
from tests.fix_pg import PASSWORD, PASSWORD_USER, PgServer

pytestmark = pytest.mark.integration

PIPE = "shop"
MODES = ["transactional", "prepared"]


def make_tables(dsn: str, *names: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for name in names:
            conn.execute(
                sql.SQL("CREATE TABLE {} (k text PRIMARY KEY, v bigint, _epoch bigint)").format(
                    sql.Identifier(name)
                )
            )


def rows(epoch: int, bump: int = 0) -> list[dict[str, Any]]:
    return [{"k": f"e{epoch}-r{i}", "v": epoch * 1000 + i + bump} for i in range(100)]


def count(dsn: str, table: str, where: str = "true") -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            sql.SQL("SELECT count(*) FROM {} WHERE " + where).format(sql.Identifier(table))
        ).fetchone()
    assert row is not None
    return int(row[0])


def cycle(dsn: str, state: Path, table: str, mode: str, **options: Any) -> CommitCycle:
    sink = postgres_sink(dsn, table, mode=mode, name="orders", **options)
    return CommitCycle(PIPE, [sink], FileProgressLog(state, PIPE))


def run(c: CommitCycle, epochs: range, bump: int = 0) -> None:
    for epoch in epochs:
        assert c.run_epoch(epoch, {"orders": rows(epoch, bump)}) == CommitSucceeded(epoch)


def advised_sql(message: str) -> str:
    """The statements the error tells the operator to run."""
    found = re.search(r"(DELETE FROM .*;)\s*$", message)
    assert found is not None, message
    return found.group(1)


@pytest.mark.parametrize("mode", MODES)
def test_fresh_state_never_reports_success_without_writing(
    pg_db: str, tmp_path: Path, mode: str
) -> None:
    make_tables(pg_db, "a", "b")
    first = cycle(pg_db, tmp_path / "state1", "a", mode)
    first.start()
    run(first, range(3))
    first.close()
    assert count(pg_db, "a") == 300

    # A fresh state with the same names, into another table: a clear error at
    # start(), before a generation is claimed; nothing is written.
    second = cycle(pg_db, tmp_path / "state2", "b", mode)
    with pytest.raises(MarkerMismatchError) as err:
        second.start()
    message = str(err.value)
    log1 = read_progress(tmp_path / "state1", PIPE).log_id
    log2 = read_progress(tmp_path / "state2", PIPE).log_id
    assert f"progress log {log1!r}" in message and f"progress log {log2!r}" in message
    assert "epochs up to 2 into table public.a" in message
    assert "resume with the original state" in message and "DELETE FROM" in message
    assert read_progress(tmp_path / "state2", PIPE).generation == 0
    assert count(pg_db, "b") == 0

    # A fresh state into the first table: the same clear error, nothing written.
    third = cycle(pg_db, tmp_path / "state3", "a", mode)
    with pytest.raises(MarkerMismatchError) as err3:
        third.start()
    assert f"progress log {log1!r}" in str(err3.value)
    assert count(pg_db, "a") == 300 and count(pg_db, "a", "v >= 10000") == 0

    # The operator follows the advice (the rows are to be written again):
    # then every row is written, none is skipped.
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute(advised_sql(str(err3.value)).encode())
    third = cycle(pg_db, tmp_path / "state3", "a", mode)
    third.start()
    run(third, range(3), bump=10_000)
    third.close()
    assert count(pg_db, "a") == 300 and count(pg_db, "a", "v >= 10000") == 300
    # The original state is now the stranger.
    again = cycle(pg_db, tmp_path / "state1", "a", mode)
    with pytest.raises(MarkerMismatchError):
        again.start()


def test_the_fence_row_tells_another_state_apart_even_without_markers(
    pg_db: str, tmp_path: Path
) -> None:
    make_tables(pg_db, "a")
    first = cycle(pg_db, tmp_path / "state1", "a", "transactional")
    first.start()
    run(first, range(3))
    first.close()
    # Retention (or an operator) removed the markers; the fence row stays.
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("DELETE FROM reconcile.reconcile_commits")
    fresh = cycle(pg_db, tmp_path / "state2", "a", "transactional")
    with pytest.raises(MarkerMismatchError) as err:
        fresh.start()
    assert "fence row" in str(err.value)
    assert count(pg_db, "a") == 300 and count(pg_db, "a", "v >= 10000") == 0


@pytest.mark.parametrize("mode", MODES)
def test_every_marker_lookup_checks_the_target(pg_db: str, tmp_path: Path, mode: str) -> None:
    """The same progress log, the sink's table changed: an epoch marked for the old table."""
    make_tables(pg_db, "a", "b")
    first = cycle(pg_db, tmp_path / "state", "a", mode)
    first.start()
    run(first, range(2))
    first.close()
    log_id = read_progress(tmp_path / "state", PIPE).log_id
    assert log_id is not None
    sink = postgres_sink(pg_db, "b", mode=mode, name="orders")
    sink.bind(WriterIdentity(PIPE, log_id))
    txn = SinkTxnId(PIPE, "orders", 1, 5)
    assert sink.stage(txn, rows(1)) == OK
    outcomes = {"prepare": sink.prepare(txn), "commit": sink.commit(txn), "abort": sink.abort(txn)}
    for op, outcome in outcomes.items():
        assert isinstance(outcome, Fatal) and isinstance(outcome.error, MarkerMismatchError), op
        assert "public.a" in outcome.reason and "public.b" in outcome.reason, op
    assert count(pg_db, "b") == 0


@pytest.mark.parametrize("mode", MODES)
def test_a_marker_that_appears_after_the_check_is_still_checked(
    pg_db: str, tmp_path: Path, mode: str
) -> None:
    """Another state commits the epoch inside the window between our marker check and insert."""
    make_tables(pg_db, "a")
    c = cycle(pg_db, tmp_path / "state", "a", mode)
    c.start()
    run(c, range(1))

    def other_state_commits_epoch_1() -> None:
        with psycopg.connect(pg_db, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO reconcile.reconcile_commits (pipeline, sink, epoch, target_schema, "
                "target_table, log_id, xid, backend_pid, generation, row_count) VALUES "
                "(%s, 'orders', 1, 'public', 'a', 'another-log', pg_current_xact_id(), 0, 1, 0)",
                (PIPE,),
            )

    with hooks.at(FENCE_CHECKED, other_state_commits_epoch_1) as window:
        result = c.run_epoch(1, {"orders": rows(1)})
    assert window.fired == 1
    # Never "already committed": the epoch stops with the mismatch, unwritten.
    assert isinstance(result, CommitFatal) and "another-log" in result.reason
    assert count(pg_db, "a", "_epoch = 1") == 0


def test_unbound_sinks_markers_never_pass_for_a_pipelines(pg_db: str, tmp_path: Path) -> None:
    make_tables(pg_db, "a")
    direct = postgres_sink(pg_db, "a", name="orders", pipeline=PIPE)
    txn = SinkTxnId(PIPE, "orders", 0, 0)
    assert direct.stage(txn, rows(0)) == direct.prepare(txn) == direct.commit(txn)
    c = cycle(pg_db, tmp_path / "state", "a", "transactional")
    with pytest.raises(MarkerMismatchError) as err:
        c.start()
    assert "a sink used directly" in str(err.value)


def test_pipeline_is_given_once(pg_db: str, tmp_path: Path) -> None:
    make_tables(pg_db, "a")
    same = cycle(pg_db, tmp_path / "ok", "a", "transactional", pipeline=PIPE)
    same.start()  # an equal pipeline= is accepted
    other = cycle(pg_db, tmp_path / "bad", "a", "transactional", pipeline="elsewhere")
    with pytest.raises(ConfigurationError) as err:
        other.start()
    assert "'elsewhere'" in str(err.value) and f"{PIPE!r}" in str(err.value)
    # A txn of another pipeline says so (not "another sink").
    sink = same.sinks["orders"]
    outcome = sink.prepare(SinkTxnId("elsewhere", "orders", 0, 1))
    assert isinstance(outcome, Fatal) and "pipeline 'elsewhere'" in outcome.reason
    assert "another sink" not in outcome.reason


# -- start() connects and checks --------------------------------------------------------------


def start_fails(dsn: str, state: Path, table: str = "a", mode: str = "transactional") -> Exception:
    c = cycle(dsn, state, table, mode)
    with pytest.raises((ConfigurationError, RetryableError)) as err:
        c.start()
    # Nothing was claimed: a start-up that cannot work burns no generation.
    assert read_progress(state, PIPE).generation == 0
    return err.value


def test_start_classifies_what_cannot_work(pg_server: PgServer, tmp_path: Path) -> None:
    db = pg_server.create_database()
    dsn = pg_server.dsn(db)
    make_tables(dsn, "a")
    wrong_pw = pg_server.dsn(db, user=PASSWORD_USER, password="Wr0ng-" + PASSWORD)
    cases = {
        "password authentication failed": wrong_pw,
        'role "nobody" does not exist': pg_server.dsn(db, user="nobody"),
        'database "nowhere" does not exist': pg_server.dsn("nowhere"),
    }
    for i, (said, bad) in enumerate(cases.items()):
        err = start_fails(bad, tmp_path / f"s{i}")
        assert isinstance(err, ConfigurationError) and said in str(err), str(err)
        assert PASSWORD not in str(err)
    missing = start_fails(dsn, tmp_path / "missing", table="absent")
    assert isinstance(missing, ConfigurationError) and "public.absent" in str(missing)
    down = start_fails(
        f"host=127.0.0.1 port=1 dbname=x user=u password='{PASSWORD}'", tmp_path / "down"
    )
    assert isinstance(down, RetryableError) and PASSWORD not in str(down)


def test_start_refuses_prepared_mode_without_prepared_transactions(tmp_path: Path) -> None:
    server = PgServer(max_prepared_transactions=0)
    try:
        db = server.create_database()
        make_tables(server.dsn(db), "a")
        err = start_fails(server.dsn(db), tmp_path / "s", mode="prepared")
        assert isinstance(err, ConfigurationError) and "max_prepared_transactions" in str(err)
    finally:
        server.stop()


@pytest.mark.parametrize("mode", MODES)
def test_a_password_that_stops_working_is_fatal_not_retried(
    private_pg_server: PgServer, tmp_path: Path, mode: str
) -> None:
    server = private_pg_server
    db = server.create_database()
    make_tables(server.dsn(db), "a")
    c = cycle(server.dsn(db, user=PASSWORD_USER, password=PASSWORD), tmp_path / "s", "a", mode)
    c.start()
    c.close()  # no idle session left: the next epoch connects again
    with server.connect() as admin:
        admin.execute(
            sql.SQL("ALTER ROLE {} PASSWORD 'rotated-away'").format(sql.Identifier(PASSWORD_USER))
        )
    result = c.run_epoch(0, {"orders": rows(0)})
    assert isinstance(result, CommitFatal), result
    assert "password authentication failed" in result.reason and PASSWORD not in result.reason
    assert count(server.dsn(db), "a") == 0
