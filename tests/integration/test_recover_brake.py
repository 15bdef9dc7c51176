"""The mass-change brake on a real Postgres: its exact boundary, what it counts, who may lift it.

A repair may delete or change at most ``max_change_fraction`` (10 %) of the
rows the sink table holds. Missing rows, and rows of epochs the sink has no
marker for (a sink catching up after a crash or a takeover), are not counted.
Every test checks the sink's own rows with psycopg.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reconcile import recover
from reconcile.core.contract import Change, ConfigurationError, MassChangeError
from reconcile.core.progress import EpochStatus
from reconcile.engine.cycle import CommitCycle
from reconcile.engine.expected import ExpectedState
from reconcile.ha.takeover import recover_sinks
from sinks.postgres.factory import postgres_sink
from tests.cli_run import cli
from tests.recovery_setup import (
    SIMPLE_DDL,
    SIMPLE_SCHEMA,
    Setup,
    expected_rows,
    make_setup,
    sink_rows,
)

pytestmark = pytest.mark.integration

ROWS = 200


@pytest.fixture
def table(pg_db: str, tmp_path: Path) -> Setup:
    setup = make_setup(pg_db, str(tmp_path), "orders", SIMPLE_SCHEMA, SIMPLE_DDL, ["id"])
    setup.write([{"id": i, "name": f"n{i}", "total": i} for i in range(ROWS)])
    return setup


def repairs(setup: Setup) -> int:
    return int(setup.scalar("SELECT count(*) FROM reconcile.reconcile_repairs"))


@pytest.mark.parametrize("mode", ["full", "buckets"])
def test_exactly_the_fraction_goes_through_and_one_row_more_is_refused(
    table: Setup, mode: str
) -> None:
    # 10 rows inserted by hand make the table 210 rows: the limit is 21 (10 %
    # of the rows the sink holds, not of the 200 expected). 10 extra + 11
    # changed is exactly 21.
    table.execute("INSERT INTO {t} (id, name, total) SELECT i, 'x', 0 FROM "
                  "generate_series(1000, 1009) i")  # fmt: skip
    table.execute("UPDATE {t} SET name = 'hand' WHERE id < 11")
    seen = recover(table.dsn, table.root, "shop", "orders", mode=mode, dry_run=True)
    assert (seen.extra, seen.changed) == (10, 11)
    assert (seen.brake_counted, seen.brake_limit, seen.sink_rows) == (21, 21, 210)
    assert not seen.mass_change
    done = recover(table.dsn, table.root, "shop", "orders", mode=mode)
    assert done.applied == 21 and sink_rows(table) == expected_rows(table)

    table.execute("INSERT INTO {t} (id, name, total) SELECT i, 'x', 0 FROM "
                  "generate_series(1000, 1009) i")  # fmt: skip
    table.execute("UPDATE {t} SET name = 'hand' WHERE id < 12")  # 22 > 21
    before = sink_rows(table)
    with pytest.raises(MassChangeError, match=r"delete or change 22 of the 210 rows") as err:
        recover(table.dsn, table.root, "shop", "orders", mode=mode)
    assert "(21 rows); nothing was written" in str(err.value)
    assert "--allow-mass-change" in str(err.value)
    assert err.value.details["counted"] == 22 and err.value.details["limit"] == 21
    assert sink_rows(table) == before and repairs(table) == 1
    assert recover(table.dsn, table.root, "shop", "orders", mode=mode, dry_run=True).mass_change
    lifted = recover(table.dsn, table.root, "shop", "orders", mode=mode, allow_mass_change=True)
    assert lifted.applied == 22 and lifted.mass_change
    assert sink_rows(table) == expected_rows(table)


def test_missing_rows_are_not_counted_so_an_emptied_table_is_refilled(table: Setup) -> None:
    table.execute("DELETE FROM {t}")
    report = recover(table.dsn, table.root, "shop", "orders", mode="full")
    assert (report.missing, report.brake_counted, report.brake_limit) == (ROWS, 0, None)
    assert report.applied == ROWS and sink_rows(table) == expected_rows(table)


def test_the_fraction_is_compared_exactly_as_written(table: Setup) -> None:
    # 0.145 x 200 is 29 exactly; in binary floating point it is 28.999999999999996.
    table.execute("UPDATE {t} SET name = 'hand' WHERE id < 29")
    done = recover(table.dsn, table.root, "shop", "orders", max_change_fraction=0.145)
    assert (done.applied, done.brake_limit) == (29, 29)
    table.execute("UPDATE {t} SET name = 'hand' WHERE id < 1")
    with pytest.raises(MassChangeError, match="1 of the 200 rows"):
        recover(table.dsn, table.root, "shop", "orders", max_change_fraction=0)
    assert recover(table.dsn, table.root, "shop", "orders", max_change_fraction=0.005).applied == 1
    table.execute("DELETE FROM {t} WHERE id >= 100")
    table.execute("INSERT INTO {t} (id, name, total) SELECT i, 'x', 0 FROM "
                  "generate_series(500, 699) i")  # fmt: skip
    full = recover(table.dsn, table.root, "shop", "orders", max_change_fraction=1)
    assert (full.missing, full.extra, full.applied) == (100, 200, 300)
    for bad in (1.5, -0.1, float("nan"), True, "0.1"):
        with pytest.raises(ConfigurationError, match="max_change_fraction"):
            recover(table.dsn, table.root, "shop", "orders", max_change_fraction=bad)  # type: ignore[arg-type]


def test_a_sink_lacking_epochs_is_brought_to_the_store_whatever_they_rewrite(
    table: Setup,
) -> None:
    # Epochs 1 and 2 are in the store only (a crash between the store's commit
    # and the sink's): they change every row and delete a quarter. Those are
    # the epochs the sink's markers say it lacks: the brake does not count them.
    table.record([{"id": i, "name": f"v1-{i}", "total": -i} for i in range(ROWS)])
    table.record([], deletes=[{"id": i} for i in range(0, ROWS, 4)])
    for mode in ["full", "auto"]:
        seen = recover(table.dsn, table.root, "shop", "orders", mode=mode, after_crash=True,
                       dry_run=True)  # fmt: skip
        assert (seen.extra, seen.changed, seen.brake_counted) == (50, 150, 0), mode
    done = recover(table.dsn, table.root, "shop", "orders", after_crash=True)
    assert done.mode == "scoped" and done.applied == ROWS
    assert sink_rows(table) == expected_rows(table)
    assert table.scalar("SELECT max(epoch) FROM reconcile.reconcile_commits") == 2
    # Drift on top of a catch-up still counts: 30 rows the store did not touch
    # since the marker, changed by hand, are 15 % of the table.
    table.record([{"id": i, "name": "v3", "total": 3} for i in range(1, 100, 2)])
    table.execute("UPDATE {t} SET total = 7 WHERE id >= 120 AND id < 160")
    before = sink_rows(table)
    with pytest.raises(MassChangeError, match="30 of the 150 rows"):
        recover(table.dsn, table.root, "shop", "orders", mode="full", after_crash=True)
    assert sink_rows(table) == before


def test_a_takeover_recovers_a_sink_lacking_an_epoch_that_rewrites_every_row(
    pg_db: str, tmp_path: Path
) -> None:
    table = make_setup(pg_db, str(tmp_path), "t", SIMPLE_SCHEMA, SIMPLE_DDL, ["id"])
    expected = ExpectedState(str(tmp_path / "store"), "p", {"t": ["id"]})
    cycle = CommitCycle("p", [postgres_sink(pg_db, "t", name="t", create_epoch_column=True)],
                        expected_state=expected)  # fmt: skip
    try:
        cycle.start()
        cycle.run_epoch(0, {"t": [{"id": i, "name": "a", "total": i} for i in range(ROWS)]})
        generation = cycle.generation
        assert generation is not None
        # The old leader decided epoch 1 (store and progress log) and died
        # before the sink's commit: the new leader's recover_sinks brings it in.
        rewrite = [{"id": i, "name": "b", "total": -i} for i in range(ROWS // 2)]
        expected.tables["t"].apply(1, [Change("upsert", r) for r in rewrite] + [
            Change("delete", {"id": i}) for i in range(ROWS // 2, ROWS)])  # fmt: skip
        cycle.progress.mark(1, EpochStatus.DECIDED, generation)
        cycle.progress.mark(1, EpochStatus.COMMITTED, generation)
        assert recover_sinks(cycle) == {"t": ROWS}
    finally:
        cycle.close()
    got = {r["id"]: (r["name"], r["total"]) for r in sink_rows(table).values()}
    assert got == {r["id"]: ("b", r["total"]) for r in rewrite}
    assert table.scalar("SELECT max(epoch) FROM reconcile.reconcile_commits") == 1


def test_watch_repair_alerts_instead_of_crossing_the_brake(table: Setup, tmp_path: Path) -> None:
    config = tmp_path / "watch.toml"
    body = (
        f'[store]\nroot = "{table.root}"\n\n[metrics]\ntextfile = "metrics.prom"\n\n'
        f'[pipelines.shop.sinks.orders]\ndsn = "{table.dsn}"\ntable = "orders"\nkeys = ["id"]\n'
    )
    config.write_text(body)
    table.execute("UPDATE {t} SET total = -1 WHERE id < 30")  # 30 of 200: 15 %
    before = sink_rows(table)
    out = cli("watch", "--config", str(config), "--every", "1s", "--count", "1", "--repair",
              "--mode", "full", "--json")  # fmt: skip
    assert out.returncode == 2, (out.stdout, out.stderr)
    found = json.loads(out.stdout.splitlines()[0])["tables"][0]
    assert found["refused"] == "mass_change"
    assert (found["counted"], found["limit"], found["sink_rows"], found["changed"]) == (
        30, 20, 200, 30
    )  # fmt: skip
    assert "refused (mass_change)" in out.stderr  # the log line
    assert sink_rows(table) == before and repairs(table) == 0
    prom = (tmp_path / "metrics.prom").read_text()
    assert 'result="mass_change"' in prom
    # An operator who has looked lifts it for one repair; watch never does.
    text = cli("repair", "--config", str(config), "--pipeline", "shop", "--table", "orders")
    assert text.returncode == 2 and "refused (mass_change)" in text.stdout
    lifted = cli("repair", "--config", str(config), "--pipeline", "shop", "--table", "orders",
                 "--allow-mass-change")  # fmt: skip
    assert lifted.returncode == 1, lifted.stdout + lifted.stderr
    assert sink_rows(table) == expected_rows(table)
    # A table configured to allow more is repaired by watch itself.
    config.write_text(body + "max_change_fraction = 0.2\n")
    table.execute("UPDATE {t} SET total = -1 WHERE id < 30")
    again = cli("watch", "--config", str(config), "--every", "1s", "--count", "1", "--repair",
                "--mode", "full", "--json")  # fmt: skip
    assert again.returncode == 1, again.stdout + again.stderr
    assert json.loads(again.stdout.splitlines()[0])["tables"][0]["applied"] == 30
    assert sink_rows(table) == expected_rows(table)


def test_the_cli_says_what_the_brake_counted_and_how_to_lift_it(table: Setup) -> None:
    table.execute("DELETE FROM {t} WHERE id >= 150")  # missing: not counted
    table.execute("UPDATE {t} SET total = -1 WHERE id < 20")  # 20 of 150
    args = ["--pg", table.dsn, "--store", table.root, "--pipeline", "shop", "--table", "orders"]
    verify = cli("verify", *args)
    assert verify.returncode == 1
    assert "mass-change brake: 20 of the 150 rows would be deleted or changed (the brake " in (
        verify.stdout
    )
    refused = cli("repair", *args, "--json")
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    assert "refused by the mass-change brake" in refused.stderr
    assert json.loads(refused.stdout)["refused"] == "mass_change"
    assert len(sink_rows(table)) == 150
    done = cli("repair", *args, "--allow-mass-change")
    assert done.returncode == 1 and "lifted for this repair" in done.stdout
    assert sink_rows(table) == expected_rows(table)
