"""A rebuild takes the pipeline over: the lease from a live main, the log from a fenced writer.

The lease is read in Postgres (``reconcile.reconcile_leases`` through the
holders' own statements): a main that holds and renews it loses it to the
rebuild at once, a standby cannot take it while the rebuild runs, and it is
free again once the rebuild is done, when only the new logic's writer may
start. A rebuild step that a fenced-off rebuild appends to the log late (it
passed its generation check before the newer rebuild took over) is not the
state: the newer writer's generation sorts above it.
"""

from __future__ import annotations

import time
from pathlib import Path

import psycopg
import pytest

from expected_state.rebuilds import RebuildLog
from reconcile.core import hooks
from reconcile.core.contract import ConfigurationError
from reconcile.ha.leading import Heartbeat
from reconcile.ha.lease import open_lease
from reconcile.rebuild import rebuild
from reconcile.rebuild.run import REBUILD_STORED
from sinks.postgres.lease import PgLease
from tests.integration.rebuild_pipeline import (
    LOGICS,
    PIPELINE,
    build,
    inputs,
    recompute,
    seed,
    state,
)

pytestmark = pytest.mark.integration

TERM_S = 2.0


class Boom(Exception):
    """The failure a hook point raises, as a crash would stop the rebuild there."""


@pytest.fixture
def shop(pg_db: str, tmp_path: Path) -> tuple[str, str]:
    """Three epochs of logic v1 in the sink and the store."""
    return seed(pg_db, str(tmp_path / "store"))


def _start(dsn: str, root: str, logic: str) -> None:
    cycle = build(dsn, root, logic)()
    try:
        cycle.start()
    finally:
        cycle.close()


def _sink(dsn: str) -> dict[int, tuple[object, ...]]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT id, total, tag FROM orders ORDER BY id").fetchall()
    return {r[0]: (r[1], r[2]) for r in rows}


def test_a_rebuild_takes_the_lease_from_a_live_main_and_frees_it_for_the_new_logic(
    shop: tuple[str, str],
) -> None:
    dsn, root = shop
    epochs = inputs()
    main = open_lease(dsn, PIPELINE, term_s=TERM_S, holder="main")
    standby = PgLease(dsn, PIPELINE, term_s=TERM_S, holder="standby")
    taker = PgLease(dsn, PIPELINE, term_s=TERM_S, holder="rebuild")
    assert main.try_acquire() is not None
    heartbeat = Heartbeat(main, TERM_S / 4)
    heartbeat.start()
    seen: dict[str, object] = {}

    def during() -> None:
        # Inside the rebuild, its lease taken and its log at "stored".
        current = taker.current()
        seen["holder"] = current.holder if current else None
        seen["main_renews"] = main.renew()
        seen["main_lost"] = heartbeat.lost.wait(TERM_S)
        seen["standby"] = standby.try_acquire()

    try:
        assert main.renew() and not heartbeat.lost.is_set()  # the main leads
        with hooks.at(REBUILD_STORED, during) as armed:
            report = rebuild(build(dsn, root), lambda _: recompute(LOGICS["v2"], epochs),
                             logic_version="v2", lease=taker)  # fmt: skip
        assert armed.fired == 1 and report.step == "switched"
        assert seen == {"holder": "rebuild", "main_renews": False, "main_lost": True,
                        "standby": None}  # fmt: skip
        # Released: the standby takes it at once, not a term later.
        started = time.monotonic()
        took = standby.try_acquire()
        assert took is not None and took.holder == "standby"
        assert time.monotonic() - started < TERM_S
        with pytest.raises(ConfigurationError, match=r"runs logic 'v1'.*hold logic 'v2'"):
            _start(dsn, root, "v1")
        _start(dsn, root, "v2")
        assert _sink(dsn) == state(LOGICS["v2"], epochs)
    finally:
        heartbeat.done.set()
        heartbeat.join(TERM_S)
        for lease in (main, standby, taker):
            lease.release()
            close = getattr(lease, "close", None)
            if close is not None:
                close()


def test_a_step_a_fenced_off_rebuild_appends_late_is_not_the_state(
    shop: tuple[str, str],
) -> None:
    dsn, root = shop
    epochs = inputs()

    def boom() -> None:
        raise Boom(REBUILD_STORED)

    with hooks.at(REBUILD_STORED, boom), pytest.raises(Boom):
        rebuild(build(dsn, root), lambda _: recompute(LOGICS["v2"], epochs), logic_version="v2")
    journal = RebuildLog(root, PIPELINE)
    zombie = journal.newest()
    assert zombie is not None and zombie.step == "stored"
    report = rebuild(build(dsn, root), lambda _: recompute(LOGICS["v2"], epochs),
                     logic_version="v2")  # fmt: skip
    assert report.resumed and report.step == "switched"
    assert report.generation is not None and report.generation > zombie.generation
    # The zombie passed its generation check before the takeover and appends
    # its next step now: the log's next number, under its old generation.
    late = journal.append(
        rebuild=zombie.rebuild,
        generation=zombie.generation,
        step="applied",
        logic_version="v2",
        previous=None,
        base_epoch=zombie.base_epoch,
    )
    assert late.seq > max(e.seq for e in journal.entries() if e.step == "switched")
    newest = journal.newest()
    assert newest is not None and newest.step == "switched"
    _start(dsn, root, "v2")  # not refused as unfinished
    with pytest.raises(ConfigurationError, match=r"runs logic 'v1'.*hold logic 'v2'"):
        _start(dsn, root, "v1")
