"""The store's retention in the config file: its default, where it is set, and bad values named."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from expected_state.housekeeping import DEFAULT_RETENTION_HOURS, DEFAULT_SAFETY_MARGIN_MINUTES
from reconcile.cli.config import ConfigFileError, load_config

FILE = """
[store]
root = "expected"
{store}

[pipelines.orders]
{pipeline}

[pipelines.orders.sinks.lines]
dsn = "postgresql://app@db:5432/shop"
table = "order_lines"
keys = ["order_id"]

[pipelines.audit.sinks.events]
dsn = "postgresql://app@db:5432/audit"
table = "events"
keys = ["event_id"]
"""


def load(tmp_path: Path, store: str = "", pipeline: str = "") -> dict[str, float]:
    path = tmp_path / "reconcile.toml"
    path.write_text(textwrap.dedent(FILE.format(store=store, pipeline=pipeline)))
    return {p.name: p.store_retention_hours for p in load_config(path, env={}).pipelines}


def test_the_retention_defaults_to_the_stores_own() -> None:
    from reconcile.cli import config

    # No extra retention: holds keep what the engine's readers read, the margin what
    # a writer has not committed yet.
    assert DEFAULT_RETENTION_HOURS == config.DEFAULT_RETENTION_HOURS == 0
    assert DEFAULT_SAFETY_MARGIN_MINUTES == config.DEFAULT_SAFETY_MARGIN_MINUTES == 10


def test_the_retention_is_the_stores_default_then_the_files_then_the_pipelines(
    tmp_path: Path,
) -> None:
    assert load(tmp_path) == {"orders": DEFAULT_RETENTION_HOURS, "audit": DEFAULT_RETENTION_HOURS}
    assert load(tmp_path, store="retention_hours = 6") == {"orders": 6, "audit": 6}
    both = load(tmp_path, store="retention_hours = 6", pipeline="store_retention_hours = 1")
    assert both == {"orders": 1, "audit": 6}
    assert load(tmp_path, pipeline="store_retention_hours = 2.0") == {"orders": 2, "audit": 0}
    # Any fraction: the store's vacuum counts it in seconds, it is not truncated.
    assert load(tmp_path, pipeline="store_retention_hours = 0.5") == {"orders": 0.5, "audit": 0}
    assert load(tmp_path, store="retention_hours = 0") == {"orders": 0, "audit": 0}


def test_the_safety_margin_is_the_stores_default_then_the_files_then_the_pipelines(
    tmp_path: Path,
) -> None:
    path = tmp_path / "reconcile.toml"

    def margins(store: str = "", pipeline: str = "") -> dict[str, float]:
        path.write_text(textwrap.dedent(FILE.format(store=store, pipeline=pipeline)))
        return {p.name: p.store_safety_margin_minutes for p in load_config(path, env={}).pipelines}

    assert margins() == {"orders": DEFAULT_SAFETY_MARGIN_MINUTES, "audit": 10}
    assert margins(store="safety_margin_minutes = 30") == {"orders": 30, "audit": 30}
    both = margins(store="safety_margin_minutes = 30", pipeline="store_safety_margin_minutes = 0.5")
    assert both == {"orders": 0.5, "audit": 30}


@pytest.mark.parametrize(
    ("store", "pipeline", "expected"),
    [
        ("", "store_retention_hours = -1",
         "pipelines.orders.store_retention_hours: expected a number of hours >= 0, got -1"),
        ("", "store_retention_hours = -0.5",
         "pipelines.orders.store_retention_hours: expected a number of hours >= 0, got -0.5"),
        ("retention_hours = nan", "",
         "store.retention_hours: expected a number of hours >= 0, got nan"),
        ("retention_hours = inf", "", "store.retention_hours: expected a number of hours >= 0"),
        ("", 'store_retention_hours = "24h"',
         "pipelines.orders.store_retention_hours: expected an integer or a number, got string"),
        ("", "store_retention_hours = true",
         "pipelines.orders.store_retention_hours: expected an integer or a number, got bool"),
        ("retention_hour = 1", "", "store.retention_hour: unknown key"),
        ("safety_margin_minutes = -1", "",
         "store.safety_margin_minutes: expected a number of minutes >= 0, got -1"),
        ("", "store_safety_margin_minutes = nan",
         "pipelines.orders.store_safety_margin_minutes: expected a number of minutes >= 0"),
    ],
)  # fmt: skip
def test_a_bad_retention_is_refused_naming_the_key_and_value(
    tmp_path: Path, store: str, pipeline: str, expected: str
) -> None:
    with pytest.raises(ConfigFileError) as err:
        load(tmp_path, store=store, pipeline=pipeline)
    assert expected in str(err.value)


def test_the_pipelines_cycle_keeps_files_for_its_retention(tmp_path: Path) -> None:
    from reconcile.cli.config_sinks import cycle_builder

    path = tmp_path / "reconcile.toml"
    own = "store_retention_hours = 3\nstore_safety_margin_minutes = 2.5"
    path.write_text(textwrap.dedent(FILE.format(store="", pipeline=own)))
    path.chmod(0o600)
    cycle = cycle_builder(load_config(path, env={}).pipeline("orders"), file=path)()
    assert cycle.expected_state is not None
    assert cycle.expected_state.retention_hours == 3
    assert cycle.expected_state.safety_margin_minutes == 2.5


@pytest.mark.parametrize("hours", [-1, -0.5, float("nan"), float("inf"), True, "24"])
@pytest.mark.parametrize("name", ["retention_hours", "safety_margin_minutes"])
def test_the_expected_state_refuses_a_bad_retention_naming_it(
    tmp_path: Path, hours: object, name: str
) -> None:
    from reconcile.core.contract import ConfigurationError
    from reconcile.engine.expected import ExpectedState

    with pytest.raises(ConfigurationError, match=rf"{name} must be a number >= 0, got"):
        ExpectedState(str(tmp_path / "expected"), "orders", {"lines": ["k"]},
                      **{name: hours})  # type: ignore[arg-type]  # fmt: skip
    assert not (tmp_path / "expected").exists()  # refused before anything is created
