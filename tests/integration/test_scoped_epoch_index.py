"""Scoped mode on a table without an index on ``_epoch``: a warning that says what to run.

Scoped recovery pulls the rows of epochs after the newest marker
(``_epoch > n``); without an index that arm reads every row, and recovery
costs what the table costs. The run still counts exactly, and says so in a log
line and in the report, naming the table and the ``CREATE INDEX`` to run;
the statement it names, run as given, ends the warning.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from reconcile import recover
from reconcile.cli.recover import summary
from tests.recovery_setup import SIMPLE_DDL, SIMPLE_SCHEMA, expected_rows, make_setup, sink_rows

pytestmark = pytest.mark.integration


def test_scoped_mode_without_an_epoch_index_warns_with_the_index_to_create(
    pg_db: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # SIMPLE_DDL declares _epoch itself: the sink adds no index to it.
    setup = make_setup(pg_db, str(tmp_path), "orders", SIMPLE_SCHEMA, SIMPLE_DDL, ["id"])
    setup.write([{"id": i, "name": f"n{i}", "total": i} for i in range(50)])
    setup.record([{"id": 7, "name": "late", "total": 0}])  # a crash: the sink is behind
    with caplog.at_level(logging.WARNING, logger="reconcile.recovery"):
        report = recover(setup.dsn, setup.root, "shop", "orders", after_crash=True)
    assert report.mode == "scoped" and report.changed == 1
    assert sink_rows(setup) == expected_rows(setup)
    (warning,) = report.warnings
    assert "public.orders" in warning and "no index on _epoch" in warning
    assert warning in [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert json.loads(report.to_json())["warnings"] == [warning]
    assert f"  warning: {warning}" in summary(report, repair=True).splitlines()
    statement = warning.split("create one with: ", 1)[1]
    assert statement == (
        'CREATE INDEX IF NOT EXISTS "orders_reconcile_epoch" ON "public"."orders" ("_epoch")'
    )
    setup.execute(statement)
    setup.record([{"id": 8, "name": "later", "total": 0}])
    report = recover(setup.dsn, setup.root, "shop", "orders", after_crash=True)
    assert report.mode == "scoped" and report.changed == 1 and report.warnings == ()
