"""A store that lost rows is reported as such, and no healthy sink row is deleted.

The three ways an outside review broke a store without its epoch going back,
each against a 10,000-row sink on a real Postgres (ten epochs of 1,000 rows):
a hand ``DeltaTable.delete`` on the store, change files replaced by valid
empty Parquet files, and a file replaced by a copy of another epoch's file.
The Delta log still records 1,000 rows for every file. Before this was
checked, repair deleted 9,000 (or 1,000) healthy rows as "extra". Every test
reads the sink's own rows with psycopg.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from reconcile import recover
from reconcile.core.contract import StoreLostRowsError
from tests.cli_run import cli
from tests.recovery_setup import SIMPLE_DDL, SIMPLE_SCHEMA, Setup, make_setup, sink_rows

pytestmark = pytest.mark.integration

EPOCHS, ROWS = 10, 1000


@pytest.fixture
def tenk(pg_db: str, tmp_path: Path) -> Setup:
    setup = make_setup(pg_db, str(tmp_path), "orders", SIMPLE_SCHEMA, SIMPLE_DDL, ["id"])
    for e in range(EPOCHS):
        setup.write(
            [{"id": i, "name": f"n{i}", "total": i} for i in range(e * ROWS, (e + 1) * ROWS)]
        )
    assert len(sink_rows(setup)) == EPOCHS * ROWS
    return setup


def change_files(setup: Setup) -> list[Path]:
    """The store's change files, by epoch (one per epoch: nothing was compacted)."""
    files = sorted(Path(setup.store.uri).glob("change-e*.parquet"))
    assert len(files) == EPOCHS
    return files


def untouched(setup: Setup, before: dict[object, object]) -> None:
    """No healthy sink row deleted or changed, no repair recorded."""
    assert sink_rows(setup) == before
    assert setup.scalar("SELECT count(*) FROM {t}") == EPOCHS * ROWS
    assert setup.scalar("SELECT count(*) FROM reconcile.reconcile_repairs") == 0


def repair_args(setup: Setup, *extra: str) -> list[str]:
    return ["repair", "--pg", setup.dsn, "--store", setup.root, "--pipeline", "shop",
            "--table", "orders", *extra]  # fmt: skip


def test_a_hand_delete_on_the_store_is_reported_as_lost_rows_not_extra(tenk: Setup) -> None:
    before = sink_rows(tenk)
    table = DeltaTable(tenk.store.uri)
    table.delete("id >= 1000")  # removes the change files of epochs 1..9
    deleted_at = DeltaTable(tenk.store.uri).version()
    for mode in ["full", "buckets", "auto"]:
        out = cli(*repair_args(tenk, "--mode", mode, "--json"))
        assert out.returncode == 2, (mode, out.stdout, out.stderr)
        assert "lost rows" in out.stderr and f"version {deleted_at} (DELETE)" in out.stderr
        refused = json.loads(out.stdout)
        assert refused["refused"] == "store_lost_rows"
        assert refused["lost_epochs"] == [str(e) for e in range(1, EPOCHS)]
        assert refused["foreign_commits"] == [deleted_at]
        assert "extra" not in refused
        untouched(tenk, before)
    # Even with the brake lifted: the store is refused before anything is pulled.
    lifted = cli(*repair_args(tenk, "--allow-mass-change"))
    assert lifted.returncode == 2 and "lost rows" in lifted.stderr
    untouched(tenk, before)
    # Undone by restoring the engine's version, the store is trusted again.
    DeltaTable(tenk.store.uri).restore(deleted_at - 1)
    again = cli(*repair_args(tenk, "--json"))
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["extra"] == 0
    untouched(tenk, before)


def test_watch_repair_alerts_on_change_files_emptied_on_disk(tenk: Setup, tmp_path: Path) -> None:
    before = sink_rows(tenk)
    files = change_files(tenk)
    schema = pq.read_schema(files[0])
    for path in files[1:]:  # nine files: valid Parquet, no rows; the log still says 1,000 each
        pq.write_table(schema.empty_table(), path)
    config = tmp_path / "watch.toml"
    config.write_text(
        f'[store]\nroot = "{tenk.root}"\n\n[metrics]\ntextfile = "metrics.prom"\n\n'
        f'[pipelines.shop.sinks.orders]\ndsn = "{tenk.dsn}"\ntable = "orders"\nkeys = ["id"]\n'
    )
    for mode in ["scoped", "full"]:
        out = cli("watch", "--config", str(config), "--every", "1s", "--count", "1", "--repair",
                  "--mode", mode, "--json")  # fmt: skip
        assert out.returncode == 2, (mode, out.stdout, out.stderr)
        table = json.loads(out.stdout.splitlines()[0])["tables"][0]
        assert table.get("refused") == "store_lost_rows", table
        assert set(table["lost_epochs"]) <= {str(e) for e in range(1, EPOCHS)}
        assert "holds 0 rows" in table["error"] or "bytes where its log entry" in table["error"]
        assert "lost rows" in out.stderr  # the log line an alert is raised from
        metrics = (tmp_path / "metrics.prom").read_text().splitlines()
        runs = [line for line in metrics if line.startswith("reconcile_verify_runs_total")]
        labels = 'pipeline="shop",result="store_lost_rows",table="orders"'
        assert runs == [f"reconcile_verify_runs_total{{{labels}}} 1.0"]
        untouched(tenk, before)


def test_a_file_replaced_by_another_epochs_file_is_lost_rows(tenk: Setup) -> None:
    before = sink_rows(tenk)
    files = change_files(tenk)
    shutil.copyfile(files[4], files[3])  # epoch 3's file now holds epoch 4's rows
    for mode in ["full", "scoped", "buckets"]:
        with pytest.raises(StoreLostRowsError, match="lost rows") as err:
            recover(tenk.dsn, tenk.root, "shop", "orders", mode=mode, since_epoch=-1)
        assert err.value.details["lost_epochs"] == ["3"], mode
        assert files[3].name in str(err.value)
        untouched(tenk, before)
    # Verify refuses too: it would report epoch 3's 1,000 rows as extra.
    with pytest.raises(StoreLostRowsError):
        recover(tenk.dsn, tenk.root, "shop", "orders", mode="full", dry_run=True)


def test_a_kept_bucket_summary_does_not_hide_a_store_that_lost_rows(tenk: Setup) -> None:
    # Buckets mode keeps the expected side's figures between runs; a run whose
    # figures all match reads no store file at all. The store's commits are
    # audited before anything else, so the damage is still found.
    assert not recover(tenk.dsn, tenk.root, "shop", "orders", mode="buckets", dry_run=True).drift
    DeltaTable(tenk.store.uri).delete("id >= 9000")
    with pytest.raises(StoreLostRowsError, match="lost rows"):
        recover(tenk.dsn, tenk.root, "shop", "orders", mode="buckets", dry_run=True)
