"""``reconcile verify|repair --spark`` through the CLI's own entry point, on the shared session."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from reconcile import cli
from tests.recovery_setup import SIMPLE_DDL, SIMPLE_SCHEMA, expected_rows, make_setup, sink_rows

pytestmark = [pytest.mark.integration, pytest.mark.spark]


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
