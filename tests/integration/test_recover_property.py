"""Property: whatever is done to the sink, a repair makes it equal to the expected state.

Hypothesis draws corruptions (deletes, inserts under new keys, value changes,
NULLs written, a NULL moved from one column to another) of a real Postgres
table of every supported type; each mode repairs; the sink then equals the
expected state (read directly, and per reladiff). Scoped mode sees only what
could differ since the sink's newest marker, so its corruptions are the crash
it is for: the store records an epoch the sink never got, and the sink's rows
of that epoch's keys, or rows of a later ``_epoch``, are damaged.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from reconcile import recover, recover_sink
from reconcile.core.contract import FencedError, WriterIdentity
from sinks.postgres.factory import postgres_sink
from tests.fix_pg import PgServer
from tests.recovery_setup import (
    TYPES_DDL,
    TYPES_KEYS,
    TYPES_SCHEMA,
    Setup,
    expected_rows,
    load_plain,
    make_setup,
    reladiff_equal_by_rank,
    sink_rows,
    types_row,
)

pytestmark = pytest.mark.integration

OPS = st.lists(
    st.tuples(
        st.sampled_from(["delete", "insert", "change", "null", "move_null"]),
        st.integers(0, 10**9),
    ),
    min_size=1,
    max_size=6,
)


def corrupt(setup: Setup, ops: list[tuple[str, int]], keys: list[tuple[Any, ...]] | None = None,
            epoch: int | None = None) -> None:  # fmt: skip
    """Apply ``ops`` to the sink by hand (to rows of ``keys`` only, if given)."""
    current = sink_rows(setup)
    pool = sorted(k for k in current if keys is None or k in keys)
    where = "WHERE region = %s AND id = %s"
    for index, (op, seed) in enumerate(ops):
        # Seeded by the op, the epoch and the position: an inserted key is new.
        rng = random.Random(f"{seed}-{setup.epoch}-{index}")
        if op == "insert" or not pool:
            row = types_row(rng)
            setup.execute(
                "INSERT INTO {t} (region, id, note, qty, _epoch) VALUES (%s, %s, %s, %s, %s)",
                row["region"], row["id"], row["note"], row["qty"], epoch,
            )  # fmt: skip
            continue
        key = pool[rng.randrange(len(pool))]
        if op == "delete":
            setup.execute("DELETE FROM {t} " + where, *key)
            pool.remove(key)
        elif op == "change":
            setup.execute("UPDATE {t} SET qty = coalesce(qty, 0) + 1, note = 'hand' " + where, *key)
        elif op == "null":
            setup.execute("UPDATE {t} SET amount = NULL, day = NULL " + where, *key)
        else:  # move a NULL: one column loses its NULL, another gains one
            setup.execute(
                "UPDATE {t} SET flag = coalesce(flag, true), at = NULL, "
                "note = CASE WHEN note IS NULL THEN 'was null' ELSE NULL END " + where,
                *key,
            )
        if epoch is not None and op != "delete":
            setup.execute("UPDATE {t} SET _epoch = %s " + where, epoch, *key)


@pytest.fixture(scope="module")
def server() -> Any:
    server = PgServer()
    yield server
    server.stop()


def fresh(server: PgServer, tmp_path: Path) -> Setup:
    dsn = server.dsn(server.create_database("prop"))
    setup = make_setup(dsn, str(tmp_path), "ledger", TYPES_SCHEMA, TYPES_DDL, TYPES_KEYS)
    rng = random.Random(1)
    setup.write([types_row(rng) for _ in range(60)])
    return setup


# No shrinking: each example costs real database round trips; the failing ops are printed.
SETTINGS = settings(max_examples=12, deadline=None, derandomize=True,
                    phases=[Phase.explicit, Phase.reuse, Phase.generate],
                    suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip


@pytest.mark.parametrize("mode", ["full", "buckets", "auto"])
def test_any_hand_corruption_is_repaired(server: PgServer, tmp_path: Path, mode: str) -> None:
    setup = fresh(server, tmp_path)

    @SETTINGS
    @given(ops=OPS)
    def check(ops: list[tuple[str, int]]) -> None:
        corrupt(setup, ops)
        report = recover(setup.dsn, setup.root, "shop", "ledger", mode=mode)
        assert sink_rows(setup) == expected_rows(setup), (ops, report)
        assert not recover(setup.dsn, setup.root, "shop", "ledger", mode=mode, dry_run=True).drift

    check()
    load_plain(setup, "expected_plain")
    # reladiff cannot range over a text key: it compares the rows numbered in key order.
    assert reladiff_equal_by_rank(setup, "expected_plain") == []


def test_any_corruption_within_the_scope_is_repaired_by_scoped_mode(
    server: PgServer, tmp_path: Path
) -> None:
    setup = fresh(server, tmp_path)
    rng = random.Random(2)

    @SETTINGS
    @given(ops=OPS, updates=st.integers(1, 5), deletes=st.integers(0, 2))
    def check(ops: list[tuple[str, int]], updates: int, deletes: int) -> None:
        # A crash: the store records an epoch the sink never got.
        held = list(expected_rows(setup).values())
        touched = [dict(r, note=f"e{setup.epoch + 1}") for r in rng.sample(held, updates)]
        gone = rng.sample([r for r in held if r not in touched], deletes)
        new = [types_row(rng) for _ in range(2)]
        setup.record(touched + new, deletes=gone)
        keys = [setup.key(r) for r in touched + gone + new]
        newest = setup.scalar("SELECT max(epoch) FROM reconcile.reconcile_commits")
        corrupt(setup, ops, keys=keys, epoch=newest + 1)
        report = recover(setup.dsn, setup.root, "shop", "ledger", mode="scoped", after_crash=True)
        assert sink_rows(setup) == expected_rows(setup), (ops, report)
        assert report.rows_pulled < len(held)  # the scope, not the table

    check()
    load_plain(setup, "expected_plain")
    # reladiff cannot range over a text key: it compares the rows numbered in key order.
    assert reladiff_equal_by_rank(setup, "expected_plain") == []


def test_a_repair_by_a_fenced_off_writer_writes_nothing(server: PgServer, tmp_path: Path) -> None:
    setup = fresh(server, tmp_path)
    setup.record([dict(r, note="late") for r in list(expected_rows(setup).values())[:3]])
    before = sink_rows(setup)
    # The commit cycle's writer is bound like start() binds it; its generation is older
    # than the fence's (a newer writer has taken over).
    log_id = setup.scalar("SELECT log_id FROM reconcile.reconcile_fences")
    setup.execute("UPDATE reconcile.reconcile_fences SET generation = 9")
    sink = postgres_sink(setup.dsn, "ledger", name="ledger")
    sink.bind(WriterIdentity("shop", log_id))
    try:
        with pytest.raises(FencedError):
            recover_sink(sink, setup.store, 3)
        assert sink_rows(setup) == before
        assert setup.scalar("SELECT count(*) FROM reconcile.reconcile_repairs") == 0
        report = recover_sink(sink, setup.store, 9)
        assert report.mode == "scoped" and report.changed == 3
        assert sink_rows(setup) == expected_rows(setup)
        owner = setup.scalar(
            "SELECT array[log_id, generation::text] FROM reconcile.reconcile_commits "
            "WHERE epoch = 1"
        )
        assert owner == [log_id, "9"]
    finally:
        sink.close()
