"""reconcile.recover on PostgreSQL: drift found with exact counts, repaired in one transaction.

Every test writes a real table through the commit cycle and the Postgres sink,
records the same epochs in a real expected-state store, changes the sink by
hand (or leaves it behind the store, as a crash would), and checks the result
on the database's own rows, markers and repairs table.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from reconcile import Mode, recover
from reconcile.core import hooks
from reconcile.core.contract import InvalidInputError, RetryableError
from reconcile.recovery.engine import PULLED
from sinks.postgres.repair import REPAIR_APPLIED
from tests.recovery_setup import (
    SIMPLE_DDL,
    SIMPLE_SCHEMA,
    TYPES_DDL,
    TYPES_KEYS,
    TYPES_SCHEMA,
    Setup,
    expected_rows,
    load_plain,
    make_setup,
    reladiff_differences,
    sink_rows,
    types_row,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def simple(pg_db: str, tmp_path: Path) -> Setup:
    setup = make_setup(pg_db, str(tmp_path), "orders", SIMPLE_SCHEMA, SIMPLE_DDL, ["id"])
    for e in range(3):
        setup.write(
            [{"id": i, "name": f"n{i}", "total": 10 * i + e} for i in range(e * 40, e * 40 + 60)]
        )
    return setup


@pytest.fixture
def typed(pg_db: str, tmp_path: Path) -> Setup:
    setup = make_setup(pg_db, str(tmp_path), "ledger", TYPES_SCHEMA, TYPES_DDL, TYPES_KEYS)
    rng = random.Random(7)
    rows = [types_row(rng) for _ in range(80)]
    setup.write(rows[:50])
    setup.write([*rows[50:], dict(rows[0], note="changed", qty=None)], deletes=[rows[1]])
    return setup


def hand_drift(setup: Setup) -> dict[str, int]:
    """Rows deleted, values changed, NULLs written, rows inserted under new keys."""
    setup.execute("DELETE FROM {t} WHERE id IN (3, 4)")
    setup.execute("UPDATE {t} SET name = 'hand' WHERE id = 5")
    setup.execute("UPDATE {t} SET total = NULL WHERE id = 6")
    setup.execute("UPDATE {t} SET total = total + 1 WHERE id = 139")
    setup.execute("INSERT INTO {t} (id, name, total) VALUES (5000, 'new', 1), (-7, NULL, NULL)")
    return {"missing": 2, "extra": 2, "changed": 3}


@pytest.mark.parametrize("mode", ["full", "buckets", "auto"])
def test_hand_drift_is_counted_exactly_and_repaired(simple: Setup, mode: str) -> None:
    assert (
        recover(simple.dsn, simple.root, "shop", "orders", mode=mode, dry_run=True).drift is False
    )
    want = hand_drift(simple)
    verify = recover(simple.dsn, simple.root, "shop", "orders", mode=mode, dry_run=True)
    assert {k: getattr(verify, k) for k in want} == want
    assert verify.applied == 0 and sink_rows(simple) != expected_rows(simple)
    repair = recover(simple.dsn, simple.root, "shop", "orders", mode=mode)
    assert {k: getattr(repair, k) for k in want} == want
    assert repair.applied == sum(want.values())
    assert sink_rows(simple) == expected_rows(simple)
    # One repair transaction, recorded with its counts.
    assert simple.scalar(
        "SELECT array[missing, extra, changed, applied] FROM reconcile.reconcile_repairs"
    ) == [2, 2, 3, 7]
    again = recover(simple.dsn, simple.root, "shop", "orders", mode=mode)
    assert not again.drift and again.applied == 0
    assert simple.scalar("SELECT count(*) FROM reconcile.reconcile_repairs") == 1


def test_buckets_mode_pulls_only_the_differing_ranges(simple: Setup) -> None:
    simple.execute("UPDATE {t} SET name = 'hand' WHERE id = 77")
    report = recover(simple.dsn, simple.root, "shop", "orders", mode="buckets", dry_run=True)
    assert report.changed == 1 and report.missing == report.extra == 0
    assert 0 < report.rows_pulled < 10 and report.buckets_compared > 10


def test_reladiff_agrees_before_and_after_the_repair(simple: Setup) -> None:
    want = hand_drift(simple)
    load_plain(simple, "expected_plain")
    before = reladiff_differences(simple, "expected_plain", SIMPLE_SCHEMA.names)
    sides = {}
    for sign, row in before:
        sides.setdefault(row[0], set()).add(sign)
    # '-': only in the sink (extra) ... '+': only in the expected table (missing).
    counted = {
        "extra": sum(1 for s in sides.values() if s == {"-"}),
        "missing": sum(1 for s in sides.values() if s == {"+"}),
        "changed": sum(1 for s in sides.values() if s == {"-", "+"}),
    }
    assert counted == want
    recover(simple.dsn, simple.root, "shop", "orders", mode="full")
    assert reladiff_differences(simple, "expected_plain", SIMPLE_SCHEMA.names) == []


@pytest.mark.parametrize("mode", ["full", "scoped", "buckets", "auto"])
def test_a_sink_behind_the_store_is_brought_to_it_with_the_markers(
    simple: Setup, mode: str
) -> None:
    # A crash between the store's commit and the sink's: epochs 3 and 4 are
    # recorded in the store only.
    simple.record([{"id": i, "name": "late", "total": i} for i in range(130, 160)],
                  deletes=[{"id": 1}])  # fmt: skip
    simple.record([{"id": 7, "name": "later", "total": 0}])
    report = recover(simple.dsn, simple.root, "shop", "orders", mode=mode, after_crash=True)
    if mode == "auto":
        assert report.mode == "scoped" and "after a restart" in report.reason
    assert (report.missing, report.extra, report.changed) == (20, 1, 11)
    assert sink_rows(simple) == expected_rows(simple)
    markers = simple.scalar(
        "SELECT array_agg(epoch ORDER BY epoch) FROM reconcile.reconcile_commits"
    )
    assert markers == [0, 1, 2, 3, 4]
    if mode == "scoped":
        assert report.rows_pulled == 12  # the sink's rows of the 32 changed keys, not the table
    assert not recover(simple.dsn, simple.root, "shop", "orders", mode=mode).drift


def test_rich_types_composite_uuid_keys_and_nulls_in_every_mode(typed: Setup) -> None:
    rng = random.Random(11)
    for mode in ["full", "buckets"]:
        keys = list(sink_rows(typed))
        typed.execute("DELETE FROM {t} WHERE region = %s AND id = %s", *keys[0])
        typed.execute("UPDATE {t} SET blob = '\\x00', at_tz = at_tz + interval '1 microsecond' "
                      "WHERE region = %s AND id = %s", *keys[1])  # fmt: skip
        typed.execute("UPDATE {t} SET amount = NULL, ratio = -0.0 WHERE region = %s AND id = %s",
                      *keys[2])  # fmt: skip
        row = types_row(rng)
        typed.execute(
            "INSERT INTO {t} (region, id, amount, note) VALUES (%s, %s, %s, %s)",
            row["region"], row["id"], row["amount"], row["note"],
        )  # fmt: skip
        report = recover(typed.dsn, typed.root, "shop", "ledger", mode=mode)
        assert (report.missing, report.extra) == (1, 1), mode
        assert report.changed >= 1, mode  # -0.0 for 0.0 is no change (the hash's rule)
        assert sink_rows(typed) == expected_rows(typed), mode


def test_a_null_moved_between_columns_is_found(typed: Setup) -> None:
    row = next(
        r for r in sink_rows(typed).values() if r["note"] is not None and r["qty"] is not None
    )
    typed.execute("UPDATE {t} SET note = NULL, qty = NULL WHERE region = %s AND id = %s",
                  row["region"], row["id"])  # fmt: skip
    for mode in ["full", "buckets"]:
        report = recover(typed.dsn, typed.root, "shop", "ledger", mode=mode, dry_run=True)
        assert report.changed == 1, mode


def test_an_epoch_committed_between_pull_and_apply_makes_the_repair_pull_again(
    simple: Setup,
) -> None:
    hand_drift(simple)
    late: list[int] = []

    def commit_an_epoch() -> None:
        late.append(simple.write([{"id": 9000, "name": "live", "total": 1}]))

    with hooks.at(PULLED, commit_an_epoch) as armed:
        report = recover(simple.dsn, simple.root, "shop", "orders", mode=Mode.FULL)
    assert armed.fired == 1 and late == [3]
    assert report.target_epoch == 3  # the second pull saw the new epoch
    assert sink_rows(simple) == expected_rows(simple)
    assert simple.scalar("SELECT count(*) FROM reconcile.reconcile_repairs") == 1


def test_a_repair_commit_without_reply_is_resolved_by_the_database(simple: Setup) -> None:
    hand_drift(simple)
    before = sink_rows(simple)

    def lose_the_connection() -> None:
        # The repair's backend dies before its COMMIT: the client gets no reply.
        simple.scalar(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name = 'reconcile:*:orders' AND state = 'idle in transaction'"
        )

    with (
        hooks.at(REPAIR_APPLIED, lose_the_connection) as armed,
        pytest.raises(RetryableError, match=r"did not take effect.*pg_xact_status"),
    ):
        recover(simple.dsn, simple.root, "shop", "orders", mode="full")
    assert armed.fired == 1
    assert sink_rows(simple) == before  # aborted, as pg_xact_status said
    recover(simple.dsn, simple.root, "shop", "orders", mode="full")
    assert sink_rows(simple) == expected_rows(simple)


def test_a_repair_commit_without_reply_is_settled_by_its_own_xid_not_an_earlier_repair(
    simple: Setup,
) -> None:
    # An earlier repair left its row in reconcile_repairs: that row must not
    # stand for this repair, whose own xid aborted.
    hand_drift(simple)
    recover(simple.dsn, simple.root, "shop", "orders", mode="full")
    assert simple.scalar("SELECT count(*) FROM reconcile.reconcile_repairs") == 1
    simple.execute("UPDATE {t} SET name = 'again' WHERE id = 8")
    before = sink_rows(simple)

    def lose_the_connection() -> None:
        simple.scalar(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name = 'reconcile:*:orders' AND state = 'idle in transaction'"
        )

    with (
        hooks.at(REPAIR_APPLIED, lose_the_connection) as armed,
        pytest.raises(RetryableError, match=r"did not take effect.*pg_xact_status"),
    ):
        recover(simple.dsn, simple.root, "shop", "orders", mode="full")
    assert armed.fired == 1
    assert sink_rows(simple) == before  # the row the aborted repair wrote is not there
    assert simple.scalar("SELECT count(*) FROM reconcile.reconcile_repairs") == 1


def test_a_repair_to_an_epoch_older_than_the_newest_marker_is_refused(simple: Setup) -> None:
    # The sink acknowledged epochs 0..2: bringing it to epoch 0 would take
    # acknowledged epochs back. The brake is lifted so that only the marker
    # check stands between the repair and the rollback.
    before = sink_rows(simple)
    for mode in ["full", "buckets"]:
        with pytest.raises(InvalidInputError, match="cannot repair to epoch 0, older than the "
                           r"sink's newest marker \(epoch 2\); nothing was written"):  # fmt: skip
            recover(simple.dsn, simple.root, "shop", "orders", mode=mode, target_epoch=0,
                    allow_mass_change=True)  # fmt: skip
        assert sink_rows(simple) == before, mode
    assert simple.scalar("SELECT count(*) FROM reconcile.reconcile_repairs") == 0
    assert simple.scalar("SELECT max(epoch) FROM reconcile.reconcile_commits") == 2
    # A verify against epoch 0 only reports; the newest marker's own epoch repairs.
    old = recover(simple.dsn, simple.root, "shop", "orders", target_epoch=0, dry_run=True)
    assert old.drift and old.applied == 0
    assert not recover(simple.dsn, simple.root, "shop", "orders", target_epoch=2).drift


def test_buckets_mode_finds_every_sink_row_when_nothing_is_expected(simple: Setup) -> None:
    # Epoch 3, recorded in the store only, deletes every row: the expected
    # state is empty, and everything the sink holds is extra.
    held = len(sink_rows(simple))
    simple.record([], deletes=[{"id": i} for i in range(140)])
    found = recover(simple.dsn, simple.root, "shop", "orders", mode="buckets", dry_run=True)
    assert (found.mode, found.missing, found.extra, found.changed) == ("buckets", 0, held, 0)
    assert found.rows_pulled == held
    # The repair brings the sink to epoch 3: the deletes are the epoch it lacks
    # (not counted by the mass-change brake), with epoch 3's marker.
    done = recover(simple.dsn, simple.root, "shop", "orders", mode="buckets")
    assert done.applied == held and done.brake_counted == 0
    assert sink_rows(simple) == {}
    assert simple.scalar("SELECT max(epoch) FROM reconcile.reconcile_commits") == 3
    assert not recover(simple.dsn, simple.root, "shop", "orders", mode="buckets").drift
