"""What the command line says and carries around a rebuild, without Spark.

- ``reconcile status`` names an unfinished rebuild, which blocks every writer,
  and what to run; once finished, the logic in force;
- a plan names the logic it replaces (the run table's, before any rebuild),
  never "None";
- after a rebuild switched the pipeline to an app, a run of that app carries
  the rebuild's logic version, even when the run table still names the logic
  before it: pointing ``app`` at the rebuilt app is the only change a user
  makes. A run of another app, or of a third logic version, is refused.

The pipeline is ``tests/integration/rebuild_pipeline.py``'s (real Postgres, a
real store); the config file is read as ``reconcile run`` reads it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from expected_state.rebuilds import RebuildLog
from reconcile.cli import main
from reconcile.cli.config import load_config
from reconcile.cli.config_sinks import cycle_builder, run_logic
from reconcile.cli.rebuild import print_report
from reconcile.core import hooks
from reconcile.core.contract import ConfigurationError
from reconcile.rebuild import plan, rebuild
from reconcile.rebuild.run import REBUILD_STORED
from tests.integration.rebuild_pipeline import (
    LOGICS,
    PIPELINE,
    build,
    inputs,
    recompute,
    seed,
)

pytestmark = pytest.mark.integration

CONFIG = """
[store]
root = "{root}"

[pipelines.shop.sinks.orders]
dsn = "{dsn}"
table = "orders"
keys = ["id"]

[pipelines.shop.run]
app = "{app}"
checkpoint = "{root}/checkpoint"
{logic}
"""


class Boom(Exception):
    """Stops the rebuild at a hook point, as a crash would."""


@pytest.fixture
def shop(pg_db: str, tmp_path: Path) -> tuple[str, str]:
    return seed(pg_db, str(tmp_path / "store"))


def _starts(dsn: str, root: str, tmp_path: Path, app: str, logic_version: str | None) -> str:
    """Build and start the cycle ``reconcile run`` builds from such a run table; its logic."""
    logic = f'logic_version = "{logic_version}"' if logic_version else ""
    path = tmp_path / "reconcile.toml"
    path.write_text(CONFIG.format(root=root, dsn=dsn, app=app, logic=logic))
    pipeline = load_config(path).pipeline(PIPELINE)
    cycle = cycle_builder(pipeline)()
    try:
        cycle.start()
    finally:
        cycle.close()
    carried = run_logic(pipeline)
    assert carried is not None and cycle.logic_version == carried
    return carried


def test_a_run_of_the_rebuilt_app_carries_the_rebuild_s_logic_version(
    shop: tuple[str, str], tmp_path: Path
) -> None:
    dsn, root = shop
    # Before any rebuild, the run table's logic is the logic.
    assert _starts(dsn, root, tmp_path, "shop_app:v1", "v1") == "v1"
    rebuild(build(dsn, root), lambda _: recompute(LOGICS["v2"], inputs()),
            logic_version="2026-12-fixed", previous="v1", app="shop_app:v2")  # fmt: skip
    newest = RebuildLog(root, PIPELINE).newest()
    assert newest is not None and newest.detail["app"] == "shop_app:v2"
    # The app changed, the run table's logic_version still the one before: carried.
    assert _starts(dsn, root, tmp_path, "shop_app:v2", "v1") == "2026-12-fixed"
    assert _starts(dsn, root, tmp_path, "shop_app:v2", None) == "2026-12-fixed"
    assert _starts(dsn, root, tmp_path, "shop_app:v2", "2026-12-fixed") == "2026-12-fixed"
    # The old app, or a third logic: refused before anything is written.
    with pytest.raises(ConfigurationError, match="runs logic 'v1', but its sinks hold logic "
                       "'2026-12-fixed'"):  # fmt: skip
        _starts(dsn, root, tmp_path, "shop_app:v1", "v1")
    with pytest.raises(ConfigurationError, match="runs logic 'v3'"):
        _starts(dsn, root, tmp_path, "shop_app:v2", "v3")


def test_status_names_an_unfinished_rebuild_that_blocks_every_writer(
    shop: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    dsn, root = shop

    def boom() -> None:
        raise Boom

    with hooks.at(REBUILD_STORED, boom) as armed, pytest.raises(Boom):
        rebuild(build(dsn, root), lambda _: recompute(LOGICS["v2"], inputs()),
                logic_version="v2", previous="v1")  # fmt: skip
    assert armed.fired == 1
    args = ["status", "--store", root, "--pipeline", PIPELINE]
    capsys.readouterr()
    assert main(args) == 0
    said = capsys.readouterr().out
    assert "rebuild: UNFINISHED: rebuild " in said and "from logic 'v1' to 'v2'" in said
    assert "No writer of the pipeline can start" in said and "--rollback" in said
    assert main([*args, "--json"]) == 0
    found = json.loads(capsys.readouterr().out)["rebuild"]
    assert (found["step"], found["finished"], found["logic_version"]) == ("stored", False, "v2")
    with pytest.raises(ConfigurationError, match="unfinished"):  # the block status reports
        cycle = build(dsn, root, "v1")()
        try:
            cycle.start()
        finally:
            cycle.close()
    rebuild(build(dsn, root), lambda _: recompute(LOGICS["v2"], inputs()), logic_version="v2")
    assert main(args) == 0
    said = capsys.readouterr().out
    assert "UNFINISHED" not in said and "the logic in force is 'v2'" in said


def test_a_plan_names_the_logic_it_replaces(
    shop: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    dsn, root = shop
    report = plan(build(dsn, root), lambda _: recompute(LOGICS["v2"], inputs()),
                  logic_version="v2", previous="v1")  # fmt: skip
    assert report.previous == "v1"
    print_report(report, json_out=False)
    first = capsys.readouterr().out.splitlines()[0]
    assert "to logic 'v2' (from 'v1')" in first
    unnamed = plan(build(dsn, root), lambda _: recompute(LOGICS["v2"], inputs()),
                   logic_version="v2")  # fmt: skip
    print_report(unnamed, json_out=False)
    first = capsys.readouterr().out.splitlines()[0]
    assert "(from an unnamed logic)" in first and "None" not in first
