"""A run table under Real-Time Mode: its keys, their defaults, and what is refused beside them."""

from __future__ import annotations

from pathlib import Path

import pytest

from reconcile.cli.config import load_config
from reconcile.cli.run_realtime import realtime_target
from tests.unit.test_config import ENV, MINIMAL, SECRET, load_error, write
from tests.unit.test_config_run import RUN, run_of

REALTIME = RUN + 'realtime = "5 seconds"\n'


def test_without_realtime_the_run_is_micro_batches(tmp_path: Path) -> None:
    run = run_of(tmp_path, MINIMAL + RUN)
    assert run.realtime is None


def test_the_defaults_and_every_key(tmp_path: Path) -> None:
    run = run_of(tmp_path, MINIMAL + REALTIME)
    assert (run.realtime, run.rows_per_txn, run.ms_per_txn, run.writer) == (
        "5 seconds", 100, 100, "jvm"
    )  # fmt: skip
    text = MINIMAL + REALTIME + 'rows_per_txn = 2\nms_per_txn = 20\nwriter = "python"\n'
    run = run_of(tmp_path, text)
    assert (run.rows_per_txn, run.ms_per_txn, run.writer) == (2, 20, "python")


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ('realtime = "soon"\n', 'orders.run.realtime: expected a duration such as "5 seconds"'),
        ('realtime = ""\n', "orders.run.realtime: must not be empty"),
        ('realtime = "5 seconds"\ntrigger = "1 second"\n', "orders.run.trigger: is the micro-"),
        ('realtime = "5 seconds"\nvia = "driver"\n', "orders.run.via: is the micro-batch"),
        ('realtime = "5 seconds"\ncollect_max_bytes = 1\n', "orders.run.collect_max_bytes: is"),
        ('realtime = "5 seconds"\nrows_per_txn = 0\n', "orders.run.rows_per_txn: must be >= 1"),
        ('realtime = "5 seconds"\nms_per_txn = -1\n', "orders.run.ms_per_txn: must be >= 1"),
        ('realtime = "5 seconds"\nwriter = "scala"\n', "orders.run.writer: expected one of"),
        ("rows_per_txn = 5\n", "orders.run.rows_per_txn: is Real-Time Mode's: set realtime"),
        ('writer = "jvm"\n', "orders.run.writer: is Real-Time Mode's"),
    ],
)
def test_bad_values_are_named(tmp_path: Path, extra: str, expected: str) -> None:
    assert expected in load_error(tmp_path, MINIMAL + RUN + extra)


def test_a_second_sink_or_one_without_markers_is_refused(tmp_path: Path) -> None:
    second = MINIMAL + '[pipelines.orders.sinks.more]\ndsn = "postgresql://app@db/shop"\n'
    second += 'table = "more"\nkeys = ["id"]\n'
    message = load_error(tmp_path, second + REALTIME)
    assert "orders.run.realtime: needs exactly one sink" in message
    assert "sinks.lines.dsn, pipelines.orders.sinks.more.dsn" in message
    sqlite = MINIMAL.replace(
        'dsn = "postgresql://app@db:5432/shop"', 'url = "sqlite:///shop.db"'
    ).replace('password_env = "PG_PASSWORD"\n', "")
    text = sqlite + REALTIME + 'lease_dsn = "host=db dbname=ha"\n'
    assert "orders.run.realtime: needs exactly one sink" in load_error(tmp_path, text)


def test_the_target_is_the_sink_with_the_frames_columns_but_kafkas(tmp_path: Path) -> None:
    text = MINIMAL.replace('table = "order_lines"', 'table = "sales.order_lines"') + REALTIME
    pipeline = load_config(write(tmp_path, text), env=ENV).pipeline("orders")
    target = realtime_target(pipeline, ["topic", "order_id", "partition", "offset", "qty"])
    assert (target.schema, target.table, target.columns) == (
        "sales", "order_lines", ("order_id", "qty")
    )  # fmt: skip
    assert (target.pipeline, target.sink) == ("orders", "lines")
    assert SECRET in target.dsn  # the connection to write with, password filled in
    assert SECRET not in repr(target)
    plain = realtime_target(load_config(write(tmp_path, MINIMAL + REALTIME), env=ENV)
                            .pipeline("orders"), ["topic", "partition", "offset", "v"])  # fmt: skip
    assert (plain.schema, plain.table) == ("public", "order_lines")


@pytest.mark.parametrize("command", ["verify", "repair"])
def test_verify_and_repair_refuse_a_realtime_pipeline_before_connecting(
    tmp_path: Path, command: str
) -> None:
    from tests.cli_run import cli

    path = write(tmp_path, MINIMAL + REALTIME)
    path.chmod(0o600)
    done = cli(command, "--config", str(path), "--pipeline", "orders", env=ENV)
    assert done.returncode == 2, done.stderr
    said = done.stdout + done.stderr
    assert "pipeline orders runs under Real-Time Mode (run.realtime)" in said
    assert "Nothing was pulled or written" in said and SECRET not in said
    assert realtime_sink_flag(tmp_path)


def realtime_sink_flag(tmp_path: Path) -> bool:
    """The sinks of a pipeline with ``run.realtime`` say so; others do not."""
    config = load_config(write(tmp_path, MINIMAL + REALTIME), env=ENV)
    plain = load_config(write(tmp_path, MINIMAL + RUN), env=ENV)
    return all(s.realtime for s in config.tables()) and not any(s.realtime for s in plain.tables())
