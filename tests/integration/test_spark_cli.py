"""``reconcile verify|repair --spark`` through the CLI's own entry point, on the shared session."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from reconcile.cli import command as cli
from tests.recovery_setup import (
    SIMPLE_DDL,
    SIMPLE_SCHEMA,
    TYPES_DDL,
    TYPES_KEYS,
    TYPES_SCHEMA,
    expected_rows,
    make_setup,
    sink_rows,
    types_row,
)

# The CLI with --spark: a Spark session in each subprocess.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def test_verify_and_repair_with_spark_exit_codes(
    spark: Any, pg_db: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    setup = make_setup(pg_db, str(tmp_path), "orders", SIMPLE_SCHEMA, SIMPLE_DDL, ["id"])
    setup.write([{"id": i, "name": f"n{i}", "total": i} for i in range(300)])
    base = ["--pg", pg_db, "--store", str(tmp_path), "--pipeline", "shop", "--table", "orders",
            "--spark", "--partitions", "3"]  # fmt: skip
    assert cli.main(["verify", *base, "--json"]) == 0
    clean = json.loads(capsys.readouterr().out)
    assert (clean["missing"], clean["rows_pulled"], clean["partitions"]) == (0, 300, 3)
    setup.execute("DELETE FROM {t} WHERE id < 5")
    setup.execute("UPDATE {t} SET total = -1 WHERE id = 200")
    assert cli.main(["verify", *base]) == 1
    assert "missing 5, extra 0, changed 1" in capsys.readouterr().out
    assert cli.main(["repair", *base, "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["applied"] == 6
    assert sink_rows(setup) == expected_rows(setup)
    assert cli.main(["verify", *base]) == 0
    capsys.readouterr()
    assert cli.main(["verify", *base, "--mode", "scoped"]) == 2  # scoped is in-process only
    assert "--spark runs full mode" in capsys.readouterr().err


def test_spark_repair_checks_the_store_and_holds_the_brake(
    spark: Any, pg_db: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    setup = make_setup(pg_db, str(tmp_path), "orders", SIMPLE_SCHEMA, SIMPLE_DDL, ["id"])
    setup.write([{"id": i, "name": f"n{i}", "total": i} for i in range(300)])
    setup.write([{"id": i, "name": f"m{i}", "total": i} for i in range(300, 400)])
    base = ["--pg", pg_db, "--store", str(tmp_path), "--pipeline", "shop", "--table", "orders",
            "--spark", "--partitions", "3"]  # fmt: skip
    setup.execute("UPDATE {t} SET total = -1 WHERE id < 41")  # 41 of 400 rows: over 10 %
    before = sink_rows(setup)
    assert cli.main(["repair", *base]) == 2
    assert "refused by the mass-change brake: it would delete or change 41 of the 400" in (
        capsys.readouterr().err
    )
    assert sink_rows(setup) == before
    assert cli.main(["repair", *base, "--allow-mass-change"]) == 1
    capsys.readouterr()
    repaired = sink_rows(setup)
    assert repaired == expected_rows(setup)
    # Epoch 1's change file emptied on disk: the executors would read no row of
    # it, and call 100 healthy sink rows extra. The driver refuses first.
    changes = sorted(Path(setup.store.uri).glob("change-e000000000001-*.parquet"))
    assert len(changes) == 1
    pq.write_table(pq.read_schema(changes[0]).empty_table(), changes[0])
    for command in (["verify"], ["repair", "--allow-mass-change"]):
        assert cli.main([*command, *base]) == 2
        err = capsys.readouterr().err
        assert "lost rows" in err and "(epoch 1)" in err, err
    assert sink_rows(setup) == repaired and len(repaired) == 400


def test_spark_verify_traces_the_drift_to_its_last_writer(
    spark: Any, pg_db: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    setup = make_setup(pg_db, str(tmp_path), "orders", SIMPLE_SCHEMA, SIMPLE_DDL, ["id"])
    setup.write([{"id": i, "name": f"n{i}", "total": i} for i in range(100)])
    setup.execute("UPDATE {t} SET total = -1 WHERE id = 7")  # a hand edit: a foreign xid
    setup.execute("DELETE FROM {t} WHERE id = 9")
    base = ["--pg", pg_db, "--store", str(tmp_path), "--pipeline", "shop", "--table", "orders",
            "--spark", "--partitions", "2"]  # fmt: skip
    assert cli.main(["verify", *base, "--json"]) == 1
    found = json.loads(capsys.readouterr().out)
    by_kind = {row["kind"]: row for row in found["provenance"]}
    changed, missing = by_kind["changed"], by_kind["missing"]
    assert (changed["key"], changed["columns"], changed["writer"]) == ({"id": 7}, ["total"],
                                                                       "foreign")  # fmt: skip
    assert changed["xid"] is not None
    assert (missing["key"], missing["writer"]) == ({"id": 9}, "none")
    assert found["foreign_writes"] == 1
    assert cli.main(["verify", *base]) == 1
    assert "foreign" in capsys.readouterr().out  # the table view names the writer too
    assert cli.main(["verify", *base, "--json", "--provenance-rows", "0"]) == 1
    assert json.loads(capsys.readouterr().out)["provenance"] == []


def test_the_job_reads_the_store_with_delta_spark_and_the_file_lists_agree(
    spark: Any, pg_db: str, tmp_path: Path
) -> None:
    from reconcile.core.contract import InvalidInputError
    from reconcile.spark.verify import spark_recover

    setup = make_setup(pg_db, str(tmp_path), "orders", SIMPLE_SCHEMA, SIMPLE_DDL, ["id"])
    setup.write([{"id": i, "name": f"n{i}", "total": i} for i in range(200)])
    setup.write([{"id": i, "name": f"m{i}", "total": -i} for i in range(150, 260)])
    setup.execute("DELETE FROM {t} WHERE id IN (3, 170)")  # one of each epoch
    setup.execute("UPDATE {t} SET total = 0 WHERE id = 250")
    found = {}
    for reader in ("auto", "delta-spark", "files"):
        report = spark_recover(spark, pg_db, str(tmp_path), "shop", "orders", partitions=2,
                               store_reader=reader)  # fmt: skip
        found[reader] = (report.missing, report.extra, report.changed, report.rows_pulled)
        by = "delta-spark" if reader != "files" else "the store version's data files"
        assert report.reason.endswith(f"read by {by}" if reader != "files" else f"from {by}")
    assert set(found.values()) == {(2, 0, 1, 258)}
    with pytest.raises(InvalidInputError, match="store_reader 'parquet': expected one of"):
        spark_recover(spark, pg_db, str(tmp_path), "shop", "orders", store_reader="parquet")


def test_a_store_table_with_a_timestamp_without_a_zone_is_read_by_delta_spark(
    spark: Any, pg_db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A timestamp without a zone needs a table-features protocol (timestampNtz).
    # delta-rs writes it without `invariants`, which delta-spark requires for the
    # store's non-nullable _epoch and _op: the store lists it when it creates the
    # table, and a writer lists it on a table an older engine created.
    import random

    from deltalake import DeltaTable

    import expected_state.store_table
    from expected_state.store import ExpectedStateStore
    from reconcile.spark.verify import spark_recover

    older = tmp_path / "older"
    for root in (tmp_path, older):
        table = "things" if root == tmp_path else "older_things"
        setup = make_setup(pg_db, str(root), table, TYPES_SCHEMA, TYPES_DDL, TYPES_KEYS)
        rng = random.Random(7)
        with monkeypatch.context() as older_engine:
            if root == older:  # created as the engine did before it listed `invariants`
                older_engine.setattr(expected_state.store_table, "create_config",
                                     lambda schema, config: dict(config))  # fmt: skip
            setup.write([types_row(rng, region) for region in ("eu",) for _ in range(20)])
        first = DeltaTable(setup.store.uri).protocol()
        # A new writer claims it; the epochs before hold the protocol they were written at.
        ExpectedStateStore(str(root), "shop", table, TYPES_KEYS, generation=1).claim()
        setup.generation = 1
        setup.write([types_row(rng, "us") for _ in range(20)])
        protocol = DeltaTable(setup.store.uri).protocol()
        assert (protocol.min_reader_version, protocol.min_writer_version) == (3, 7)
        assert "invariants" in (protocol.writer_features or ()), protocol
        assert ("invariants" in (first.writer_features or ())) is (root == tmp_path), first
        setup.execute("DELETE FROM {t} WHERE region = 'eu'")
        report = spark_recover(spark, pg_db, str(root), "shop", table, partitions=2,
                               store_reader="delta-spark")  # fmt: skip
        assert (report.missing, report.extra, report.changed, report.rows_pulled) == (20, 0, 0, 20)
        assert report.reason.endswith("read by delta-spark"), report.reason
