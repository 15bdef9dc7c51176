"""Drift provenance on real PostgreSQL: who last wrote a differing row, when, and whether it was us.

The servers run with ``track_commit_timestamp`` on (one test: off). Rows are
changed by hand in transactions whose xid and commit time the test reads from
the server itself, then ``verify`` must name that xid, that time and
"foreign"; rows the engine wrote (an epoch's commit, a repair) must be named
"the engine's", with the xid the server recorded for them.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from reconcile.recovery import ReconcileReport, recover
from reconcile.recovery.provenance import NO_COMMIT_TIMES, NOT_AVAILABLE
from tests.cli_run import cli
from tests.fix_pg import PgServer, markers_table
from tests.recovery_setup import (
    SIMPLE_DDL,
    SIMPLE_SCHEMA,
    TYPES_DDL,
    TYPES_KEYS,
    TYPES_SCHEMA,
    Setup,
    make_setup,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def tracking_server() -> Iterator[PgServer]:
    """A server that records every transaction's commit time."""
    server = PgServer(track_commit_timestamp="on")
    yield server
    server.stop()


@pytest.fixture
def simple(tracking_server: PgServer, tmp_path: Path) -> Iterator[Setup]:
    """``orders`` (key ``id``) with rows 0..9 written by epoch 0."""
    name = tracking_server.create_database()
    setup = make_setup(tracking_server.dsn(name), str(tmp_path), "orders", SIMPLE_SCHEMA,
                       SIMPLE_DDL, ["id"])  # fmt: skip
    setup.write([{"id": i, "name": f"n{i}", "total": i} for i in range(10)])
    yield setup
    tracking_server.drop_database(name)


def hand_edit(dsn: str, statement: str, *params: Any) -> tuple[str, dt.datetime]:
    """Run ``statement`` in a transaction of its own: (its xid, its commit time), by the server."""
    with psycopg.connect(dsn) as conn:
        conn.execute(statement, params or None)  # type: ignore[arg-type]
        row = conn.execute("SELECT pg_current_xact_id()::text").fetchone()
        assert row is not None
        xid = str(row[0])
    with psycopg.connect(dsn) as conn:
        at = conn.execute("SELECT pg_xact_commit_timestamp(%s::xid8::xid)", (xid,)).fetchone()
    assert at is not None and at[0] is not None
    return xid, at[0]


def recorded_xids(dsn: str, what: str) -> list[str]:
    """The xids the engine recorded: of its markers (``what="commits"``) or its repairs."""
    with psycopg.connect(dsn) as conn:
        markers = markers_table(conn)
        assert markers is not None
        table = sql.Identifier(markers.as_string(conn).split(".")[0].strip('"'),
                               f"reconcile_{what}")  # fmt: skip
        return [str(r[0]) for r in conn.execute(
            sql.SQL("SELECT xid::text FROM {} ORDER BY xid").format(table))]  # fmt: skip


def verify(setup: Setup, **options: Any) -> ReconcileReport:
    return recover(setup.dsn, setup.root, setup.pipeline, setup.table, dry_run=True,
                   mode="full", **options)  # fmt: skip


def by_key(report: ReconcileReport, key: str = "id") -> dict[Any, dict[str, Any]]:
    return {row["key"][key]: row for row in report.provenance}


def test_hand_edit_is_foreign_with_its_time_and_the_engines_writes_are_the_engines(
    simple: Setup,
) -> None:
    # Row 5 is changed by hand and repaired: the repair's transaction writes it.
    hand_edit(simple.dsn, "UPDATE orders SET total = -5 WHERE id = 5")
    recover(simple.dsn, simple.root, simple.pipeline, simple.table, mode="full")
    # The store moves on without the sink for rows 5 and 7: they now differ,
    # last written by the repair (5) and by epoch 0's commit (7).
    simple.record([{"id": 5, "name": "new5", "total": 50}, {"id": 7, "name": "n7", "total": 70}])
    # Row 3 is changed by hand, in two columns.
    xid, at = hand_edit(simple.dsn, "UPDATE orders SET name = 'x', total = -3 WHERE id = 3")
    report = verify(simple)
    assert report.changed == 3
    rows = by_key(report)
    assert rows[3]["writer"] == "foreign" and rows[3]["xid"] == xid
    assert dt.datetime.fromisoformat(rows[3]["committed_at"]) == at
    assert rows[3]["columns"] == ["name", "total"]
    [repair_xid] = recorded_xids(simple.dsn, "repairs")
    assert rows[5]["writer"] == "engine" and rows[5]["xid"] == repair_xid
    assert rows[5]["columns"] == ["name", "total"]
    assert rows[7]["writer"] == "engine" and rows[7]["xid"] in recorded_xids(simple.dsn, "commits")
    assert rows[7]["columns"] == ["total"] and rows[7]["committed_at"] is not None
    assert report.foreign_writes == 1 and report.provenance_note == ""
    # Changed rows come first, in key order.
    assert [r["key"]["id"] for r in report.provenance] == [3, 5, 7]


def test_a_marker_with_the_same_low_32_bits_from_another_epoch_is_not_ours(
    simple: Setup,
) -> None:
    # The row's xmin holds only the low 32 bits of its xid; a recorded xid8 that
    # shares them but lies 2^32 transactions earlier names another transaction.
    # The planted marker is of epoch 1, which the store has decided (a marker of an
    # epoch it never decided would be refused as untrusted before any tracing).
    xid, _ = hand_edit(simple.dsn, "UPDATE orders SET total = -1 WHERE id = 1")
    assert simple.record([{"id": 100, "name": "n100", "total": 100}], []) == 1
    with psycopg.connect(simple.dsn) as conn:
        markers = markers_table(conn)
        assert markers is not None
        conn.execute(
            sql.SQL(
                "INSERT INTO {} (pipeline, sink, epoch, target_schema, target_table, log_id, "
                "xid, backend_pid, generation, row_count) SELECT pipeline, sink, 1, "
                "target_schema, target_table, log_id, (%s::bigint + 4294967296)::text::xid8, "
                "backend_pid, generation, 0 FROM {} WHERE epoch = 0"
            ).format(markers, markers),
            (int(xid),),
        )
    row = by_key(verify(simple))[1]
    assert row["xid"] == xid and row["writer"] == "foreign"


def test_several_key_columns_a_missing_row_and_extra_row(
    tracking_server: PgServer, tmp_path: Path
) -> None:
    name = tracking_server.create_database()
    try:
        setup = make_setup(tracking_server.dsn(name), str(tmp_path), "typed", TYPES_SCHEMA,
                           TYPES_DDL, TYPES_KEYS)  # fmt: skip
        ids = [str(uuid.UUID(int=i)) for i in range(4)]
        blank = dict.fromkeys(TYPES_SCHEMA.names)
        setup.write([{**blank, "region": "eu", "id": i, "note": "a", "qty": 1} for i in ids])
        changed_xid, _ = hand_edit(setup.dsn, "UPDATE typed SET qty = 2 WHERE id = %s", ids[1])
        hand_edit(setup.dsn, "DELETE FROM typed WHERE id = %s", ids[2])
        extra_xid, _ = hand_edit(
            setup.dsn, "INSERT INTO typed (region, id, qty) VALUES ('us', %s, 9)", ids[3]
        )
        report = recover(setup.dsn, setup.root, setup.pipeline, setup.table, dry_run=True,
                         mode="full")  # fmt: skip
        kinds = [(r["kind"], r["key"], r["writer"], r["xid"]) for r in report.provenance]
        assert kinds == [
            ("changed", {"region": "eu", "id": ids[1]}, "foreign", changed_xid),
            ("extra", {"region": "us", "id": ids[3]}, "foreign", extra_xid),
            ("missing", {"region": "eu", "id": ids[2]}, "none", None),
        ]
        assert report.provenance[0]["columns"] == ["qty"]
        assert (
            report.provenance[2]["committed_at"] is None and "lacks" in report.provenance[2]["note"]
        )
        assert report.foreign_writes == 2
    finally:
        tracking_server.drop_database(name)


def test_exactly_n_and_n_plus_one_differing_rows(simple: Setup) -> None:
    hand_edit(simple.dsn, "UPDATE orders SET total = -1 WHERE id IN (1, 2, 4)")
    exactly = verify(simple, provenance_rows=3)
    assert [r["key"]["id"] for r in exactly.provenance] == [1, 2, 4]
    assert exactly.foreign_writes == 3
    hand_edit(simple.dsn, "DELETE FROM orders WHERE id = 9")  # N changed and one missing
    one_more = verify(simple, provenance_rows=3)
    assert one_more.missing + one_more.changed == 4
    assert [(r["kind"], r["key"]["id"]) for r in one_more.provenance] == [
        ("changed", 1), ("changed", 2), ("changed", 4)
    ]  # fmt: skip
    hand_edit(simple.dsn, "UPDATE orders SET total = -1 WHERE id = 6")  # N + 1 changed
    cut = verify(simple, provenance_rows=3)
    assert [r["key"]["id"] for r in cut.provenance] == [1, 2, 4] and cut.foreign_writes == 3
    assert [r["key"]["id"] for r in verify(simple, provenance_rows=5).provenance] == [1, 2, 4, 6, 9]
    off = verify(simple, provenance_rows=0)
    assert off.provenance == () and off.foreign_writes is None and off.changed == 4


def test_a_sink_that_cannot_tell_says_so(simple: Setup) -> None:
    hand_edit(simple.dsn, "UPDATE orders SET total = -1 WHERE id = 1")
    params = conninfo_to_dict(simple.dsn)
    url = f"postgresql+psycopg://{params['user']}@{params['host']}:{params['port']}/{params['dbname']}"
    # Through SQLAlchemy, as any database but PostgreSQL's fast path.
    report = recover(url, simple.root, simple.pipeline, simple.table, dry_run=True, mode="full",
                     fast_path=False)  # fmt: skip
    assert report.changed == 1
    assert report.provenance == () and report.provenance_note == NOT_AVAILABLE
    assert report.foreign_writes is None


def test_without_commit_timestamps_the_time_is_null_and_the_report_says_why(
    pg_db: str, tmp_path: Path
) -> None:
    setup = make_setup(pg_db, str(tmp_path), "orders", SIMPLE_SCHEMA, SIMPLE_DDL, ["id"])
    setup.write([{"id": i, "name": f"n{i}", "total": i} for i in range(3)])
    with psycopg.connect(pg_db) as conn:
        conn.execute("UPDATE orders SET total = -1 WHERE id = 1")
        xid = str(conn.execute("SELECT pg_current_xact_id()::text").fetchone()[0])  # type: ignore[index]
    setup.record([{"id": 2, "name": "m2", "total": 20}])
    report = verify(setup)
    rows = by_key(report)
    assert rows[1]["writer"] == "foreign" and rows[1]["xid"] == xid
    assert rows[2]["writer"] == "engine"
    assert rows[1]["committed_at"] is None and rows[1]["note"] == NO_COMMIT_TIMES
    assert report.provenance_note == NO_COMMIT_TIMES


def test_verify_json_and_table_view_carry_provenance(simple: Setup) -> None:
    xid, _ = hand_edit(simple.dsn, "UPDATE orders SET name = 'x' WHERE id = 2")
    base = ["verify", "--pg", simple.dsn, "--store", simple.root, "--pipeline", "shop",
            "--table", "orders", "--mode", "full"]  # fmt: skip
    found = cli(*base, "--json")
    assert found.returncode == 1, found.stderr
    out = json.loads(found.stdout)
    assert out["foreign_writes"] == 1
    assert [(r["key"], r["columns"], r["xid"], r["writer"]) for r in out["provenance"]] == [
        ({"id": 2}, ["name"], xid, "foreign")
    ]
    view = cli(*base)
    assert view.returncode == 1, view.stderr
    assert "provenance of 1 of the 1 differing rows (1 written by a foreign" in view.stdout
    assert f"changed (id=2) columns name: xid {xid}, committed 20" in view.stdout
    assert view.stdout.rstrip().endswith("foreign")


def test_watch_exports_the_foreign_writes(simple: Setup, tmp_path: Path) -> None:
    config = tmp_path / "reconcile.toml"
    config.write_text(
        f"""
[store]
root = "{simple.root}"

[metrics]
textfile = "metrics.prom"

[pipelines.shop.sinks.orders]
dsn = "{simple.dsn}"
table = "orders"
keys = ["id"]
mode = "full"
max_change_fraction = 0.5  # 10 rows: two hand edits are a fifth of the table
"""
    )
    hand_edit(simple.dsn, "UPDATE orders SET total = -1 WHERE id IN (1, 2)")
    simple.record([{"id": 3, "name": "m3", "total": 30}])  # the engine's row, differing
    watched = cli("watch", "--config", str(config), "--every", "1s", "--count", "1")
    assert watched.returncode == 1, watched.stderr
    assert "2 rows written by 1 foreign transaction" in watched.stdout
    exported = (tmp_path / "metrics.prom").read_text()
    assert 'reconcile_drift_foreign_writes{pipeline="shop",table="public.orders"} 2.0' in exported
    # Repaired in the first round, clean in the second: the gauge is back to 0.
    again = cli("watch", "--config", str(config), "--every", "1s", "--count", "2", "--repair",
                "--json")  # fmt: skip
    assert again.returncode == 0, again.stderr
    rounds = [json.loads(line)["tables"][0] for line in again.stdout.splitlines()]
    assert [(r["foreign_writes"], r["applied"] > 0) for r in rounds] == [(2, True), (0, False)]
    exported = (tmp_path / "metrics.prom").read_text()
    assert 'reconcile_drift_foreign_writes{pipeline="shop",table="public.orders"} 0.0' in exported


def test_a_frozen_row_is_unknown_not_guessed(simple: Setup) -> None:
    # VACUUM FREEZE moves relfrozenxid past the row's xmin: its full xid can no
    # longer be rebuilt from 32 bits, so the report says unknown, with no xid.
    hand_edit(simple.dsn, "UPDATE orders SET total = -1 WHERE id = 1")
    with psycopg.connect(simple.dsn, autocommit=True) as conn:
        conn.execute("VACUUM (FREEZE) orders")
        frozen = conn.execute(
            "SELECT age(o.xmin) > age(c.relfrozenxid) FROM orders o, pg_class c "
            "WHERE o.id = 1 AND c.oid = 'orders'::regclass"
        ).fetchone()
    assert frozen == (True,)
    row = by_key(verify(simple))[1]
    assert (row["writer"], row["xid"], row["committed_at"]) == ("unknown", None, None)
    assert "frozen" in row["note"]


def test_a_row_older_than_the_oldest_kept_marker_is_unknown(simple: Setup) -> None:
    # `reconcile pg prune` deletes old markers: a row that epoch wrote has an
    # xid no marker records any more, and must not be called a foreign write.
    simple.write([{"id": 10, "name": "n10", "total": 10}])
    with psycopg.connect(simple.dsn) as conn:
        markers = markers_table(conn)
        assert markers is not None
        conn.execute(sql.SQL("DELETE FROM {} WHERE epoch = 0").format(markers))
    xid, _ = hand_edit(simple.dsn, "UPDATE orders SET total = -4 WHERE id = 4")
    simple.record([{"id": 2, "name": "m2", "total": 20}, {"id": 10, "name": "m10", "total": 0}])
    rows = by_key(verify(simple))
    assert (rows[2]["writer"], rows[2]["xid"] is not None) == ("unknown", True)
    assert "oldest kept marker (epoch 1)" in rows[2]["note"]
    assert (rows[4]["writer"], rows[4]["xid"]) == ("foreign", xid)
    assert rows[10]["writer"] == "engine"


def test_a_role_that_cannot_trace_still_verifies_and_is_told_why(simple: Setup) -> None:
    # Without TEMP on the database the keys cannot be staged: the verify still
    # counts the drift, and the report says why no row was traced.
    role = f"verifier_{uuid.uuid4().hex[:8]}"
    dbname = conninfo_to_dict(simple.dsn)["dbname"]
    with psycopg.connect(simple.dsn, autocommit=True) as conn:
        markers = markers_table(conn)
        assert markers is not None
        engine_schema = sql.Identifier(markers.as_string(conn).split(".")[0].strip('"'))
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
        conn.execute(
            sql.SQL("REVOKE TEMP ON DATABASE {} FROM PUBLIC").format(sql.Identifier(dbname))
        )
        conn.execute(sql.SQL("GRANT SELECT ON orders TO {}").format(sql.Identifier(role)))
        conn.execute(
            sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(engine_schema, sql.Identifier(role))
        )
        conn.execute(
            sql.SQL("GRANT SELECT ON ALL TABLES IN SCHEMA {} TO {}").format(
                engine_schema, sql.Identifier(role)
            )
        )
    hand_edit(simple.dsn, "UPDATE orders SET total = -1 WHERE id = 1")
    params = conninfo_to_dict(simple.dsn)
    params["user"] = role
    limited = " ".join(f"{k}={v}" for k, v in params.items())
    report = recover(limited, simple.root, simple.pipeline, simple.table, dry_run=True, mode="full")
    assert report.changed == 1 and report.provenance == () and report.foreign_writes is None
    assert report.provenance_note.startswith("provenance could not be read: ")
    assert "temporary tables" in report.provenance_note
