"""``reconcile verify|repair|watch --config FILE`` on an Iceberg table, as real processes.

A pipeline writes ``shop.order_lines`` (sink ``lines``) of a SQL catalog through
a commit cycle with an expected state; rows are then changed by hand with
pyiceberg, and the commands are checked against what the table holds after.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.expressions import EqualTo

from reconcile import CommitCycle, CommitSucceeded
from reconcile.engine.expected import ExpectedState
from sinks.iceberg.sink import IcebergSink
from tests.cli_run import cli
from tests.fix_iceberg import catalog_uri

pytestmark = pytest.mark.integration

EPOCHS = 6
SCHEMA = pa.schema([("id", pa.int64()), ("qty", pa.int32())])


def lines_sink(uri: str) -> IcebergSink:
    return IcebergSink("lines", f"{uri}&namespace=shop&table=order_lines&key=id", schema=SCHEMA)


def table_rows(uri: str) -> list[tuple[int, int]]:
    table = lines_sink(uri).table()
    assert table is not None
    rows = table.scan().to_arrow().sort_by("id").to_pylist()
    return [(r["id"], r["qty"]) for r in rows]


def written(tmp_path: Path) -> dict[str, Any]:
    uri = catalog_uri(tmp_path / "lake", name="lake")
    expected = ExpectedState(str(tmp_path / "expected"), "orders", {"lines": ["id"]})
    cycle = CommitCycle("orders", [lines_sink(uri)], expected_state=expected)
    cycle.start()
    for epoch in range(EPOCHS):
        lines = [{"id": epoch * 10 + i, "qty": i + epoch} for i in range(10)]
        assert isinstance(cycle.run_epoch(epoch, {"lines": lines}), CommitSucceeded)
    cycle.close()
    config = tmp_path / "reconcile.toml"
    config.write_text(
        f"""
[store]
root = "expected"

[pipelines.orders.sinks.lines]
url = "{uri}"
table = "shop.order_lines"
keys = ["id"]
"""
    )
    return {"uri": uri, "config": str(config)}


def test_verify_repair_and_watch_an_iceberg_table_from_the_config_file(tmp_path: Path) -> None:
    setup = written(tmp_path)
    uri, config = setup["uri"], setup["config"]
    before = table_rows(uri)
    table = lines_sink(uri).table()
    assert table is not None
    table.delete(EqualTo("id", 3))  # by hand: a row of epoch 0 gone
    drift = cli("verify", "--config", config, "--all", "--json")
    assert drift.returncode == 1, drift.stderr
    [found] = json.loads(drift.stdout)["tables"]
    assert (found["sink"], found["missing"], found["extra"], found["changed"]) == ("lines", 1, 0, 0)
    repaired = cli("repair", "--config", config, "--pipeline", "orders", "--table", "lines")
    assert repaired.returncode == 1, repaired.stderr  # drift was found (and repaired)
    assert "orders.lines (shop.order_lines): missing 1" in repaired.stdout
    assert table_rows(uri) == before
    # watch: a row of the newest epoch changed by hand, found and repaired in scoped mode.
    table = lines_sink(uri).table()
    assert table is not None
    newest = (EPOCHS - 1) * 10 + 5
    changed = table.scan(row_filter=EqualTo("id", newest)).to_arrow()
    changed = changed.set_column(1, changed.schema.field("qty"), pa.array([-1], pa.int32()))
    table.overwrite(changed, overwrite_filter=EqualTo("id", newest))
    watched = cli("watch", "--config", config, "--pipeline", "orders", "--every", "1s",
                  "--count", "1", "--epochs", "2", "--repair", "--json")  # fmt: skip
    assert watched.returncode == 1, watched.stderr  # its one round found drift
    [first] = json.loads(watched.stdout)["tables"]
    assert (first["mode"], first["changed"], first["applied"]) == ("scoped", 1, 1)
    assert table_rows(uri) == before
