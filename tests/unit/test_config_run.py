"""A pipeline's ``run`` table: defaults, paths, the lease's database, and errors naming the key."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from reconcile.cli.config import RunSettings, load_config
from tests.unit.test_config import ENV, EXAMPLE, MINIMAL, SECRET, load_error, write

RUN = """
[pipelines.orders.run]
app = "shop.stream:orders"
checkpoint = "state/checkpoints/orders"
"""


def run_of(tmp_path: Path, text: str, env: dict[str, str] | None = None) -> RunSettings:
    config = load_config(write(tmp_path, text), env=ENV if env is None else env)
    run = config.pipeline("orders").run
    assert run is not None
    return run


def test_without_a_run_table_there_is_no_run(tmp_path: Path) -> None:
    assert load_config(write(tmp_path, MINIMAL), env=ENV).pipeline("orders").run is None


def test_the_defaults(tmp_path: Path) -> None:
    run = run_of(tmp_path, MINIMAL + RUN)
    checkpoint = (tmp_path / "state" / "checkpoints" / "orders").resolve()
    assert run.app == "shop.stream:orders"
    assert run.checkpoint == str(checkpoint)
    assert run.staging == str(checkpoint.parent / "orders.staging")  # beside the checkpoint
    assert (run.trigger, run.trigger_args, run.via) == (None, None, "auto")
    assert run.collect_max_bytes is None  # the writer's default
    assert (run.lease_term_s, run.master, run.spark_conf) == (2.0, "local[2]", {})
    # The lease is in the first sink's database, with its password.
    assert run.lease_from == "pipelines.orders.sinks.lines.dsn"
    assert f"password={SECRET}" in run.lease.get_secret_value()
    assert SECRET not in repr(run)
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.app = "other:f"  # type: ignore[misc]


def test_every_key(tmp_path: Path) -> None:
    text = (
        MINIMAL
        + RUN
        + """
staging = "/shared/staging/orders"
trigger = "500 milliseconds"
via = "driver"
collect_max_bytes = 1048576
lease_term_s = 3
lease_dsn = "host=leases dbname=ha user=app password=${LEASE_PW}"
master = "spark://head:7077"

[pipelines.orders.run.spark]
"spark.sql.shuffle.partitions" = "2"
"spark.executor.memory" = "1g"
"""
    )
    run = run_of(tmp_path, text, env={**ENV, "LEASE_PW": SECRET})
    assert run.staging == "/shared/staging/orders"
    assert run.trigger_args == {"processingTime": "500 milliseconds"}
    assert (run.via, run.lease_term_s, run.master) == ("driver", 3.0, "spark://head:7077")
    assert run.collect_max_bytes == 1048576
    assert run.spark_conf == {"spark.sql.shuffle.partitions": "2", "spark.executor.memory": "1g"}
    assert run.lease_from == "pipelines.orders.run.lease_dsn"
    assert f"password={SECRET}" in run.lease.get_secret_value()
    assert SECRET not in repr(run) and SECRET not in str(run.lease)
    now = run_of(tmp_path, MINIMAL + RUN + 'trigger = "available-now"\n')
    assert now.trigger_args == {"availableNow": True}


AUDIT_SINK = """
[pipelines.orders.sinks.audit]
url = "sqlite:///audit.db"
table = "audit"
keys = ["id"]
"""


def test_the_lease_goes_to_the_first_postgres_sink(tmp_path: Path) -> None:
    text = AUDIT_SINK + MINIMAL + RUN  # the SQLite sink comes first in the file
    assert run_of(tmp_path, text).lease_from == "pipelines.orders.sinks.lines.dsn"
    as_url = MINIMAL.replace(
        'dsn = "postgresql://app@db:5432/shop"', 'url = "postgresql+psycopg://app@db:5432/shop"'
    )
    assert run_of(tmp_path, as_url + RUN).lease_from == "pipelines.orders.sinks.lines.url"


def test_a_staging_beside_a_uri_checkpoint_is_required(tmp_path: Path) -> None:
    text = MINIMAL + RUN.replace('"state/checkpoints/orders"', '"hdfs://nn/ckpt/orders"')
    assert "orders.run.staging: is required when the checkpoint is a URI" in load_error(
        tmp_path, text
    )
    run = run_of(tmp_path, text + 'staging = "/shared/staging"\n')
    assert run.checkpoint == "hdfs://nn/ckpt/orders" and run.staging == "/shared/staging"


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ('appp = "x"\n', "orders.run.appp: unknown key (did you mean 'app'?); known: ["),
        ("via = 1\n", "orders.run.via: expected a string, got int"),
        ('via = "cluster"\n', "orders.run.via: expected one of ['auto', 'executors', 'driver']"),
        ("collect_max_bytes = -1\n", "orders.run.collect_max_bytes: must be >= 0, got -1"),
        ('collect_max_bytes = "16m"\n', "orders.run.collect_max_bytes: expected an integer"),
        ('trigger = "soon"\n', 'orders.run.trigger: expected a duration such as "1 second"'),
        ('trigger = "1s"\n', "orders.run.trigger: expected a duration"),
        ("lease_term_s = 0\n", "orders.run.lease_term_s: must be > 0, got 0"),
        ("lease_term_s = true\n", "orders.run.lease_term_s: expected an integer or a number"),
        ('master = ""\n', "orders.run.master: must not be empty"),
        ('staging = "s3://b/staging"\n', "orders.run.staging: expected a folder"),
        ('lease_dsn = "host=x password=p ${SECRET_VAR}"\n', "lease_dsn: environment variable"),
        ("[pipelines.orders.run.spark]\nx = 1\n", "orders.run.spark.x: expected a string, got int"),
    ],
)
def test_bad_values_are_named(tmp_path: Path, extra: str, expected: str) -> None:
    assert expected in load_error(tmp_path, MINIMAL + RUN + extra)


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ('app = "shop.stream:orders"\n', "", "orders.run.app: is required"),
        ('"shop.stream:orders"', '"shop.stream.orders"', 'orders.run.app: expected "package'),
        ('"shop.stream:orders"', '"shop stream:orders"', "orders.run.app: expected"),
        ('checkpoint = "state/checkpoints/orders"\n', "", "orders.run.checkpoint: is required"),
    ],
)
def test_bad_app_and_checkpoint_are_named(
    tmp_path: Path, old: str, new: str, expected: str
) -> None:
    assert expected in load_error(tmp_path, MINIMAL + RUN.replace(old, new))


def test_a_lease_needs_a_postgres_database(tmp_path: Path) -> None:
    text = MINIMAL.replace(
        'dsn = "postgresql://app@db:5432/shop"', 'url = "sqlite:///shop.db"'
    ).replace('password_env = "PG_PASSWORD"\n', "")
    message = load_error(tmp_path, text + RUN)
    assert (
        "pipelines.orders.run.lease_dsn: is required: no sink of this pipeline has a Postgres"
        in (message)
    )
    assert run_of(tmp_path, text + RUN + 'lease_dsn = "host=db dbname=ha"\n').lease_from.endswith(
        "run.lease_dsn"
    )


def test_a_progress_folder_is_refused_with_a_run_table(tmp_path: Path) -> None:
    text = MINIMAL.replace(
        "[pipelines.orders.sinks.lines]", '[pipelines.orders]\nprogress = "p"\n\n'
        "[pipelines.orders.sinks.lines]"
    )  # fmt: skip
    load_config(write(tmp_path, text), env=ENV)  # fine without a run table
    message = load_error(tmp_path, text + RUN)
    assert "pipelines.orders.progress: a pipeline with a run table keeps its progress" in message


def test_a_secret_in_the_lease_dsn_is_never_shown(tmp_path: Path) -> None:
    message = load_error(tmp_path, MINIMAL + RUN + f'lease_dsn = "host=x password=p {SECRET}"\n')
    assert "orders.run.lease_dsn: not a valid libpq connection string" in message


def test_the_examples_commented_run_table_loads_once_uncommented(tmp_path: Path) -> None:
    text = EXAMPLE.read_text()
    head, block = text.split("# [pipelines.audit.run]")
    lines = ("[pipelines.audit.run]" + block).splitlines()
    uncommented = [line[2:] if line.startswith("# ") else line.lstrip("#") for line in lines]
    path = tmp_path / "reconcile.toml"
    path.write_text(head + "\n".join(uncommented) + "\n")
    run = load_config(path, env=ENV).pipeline("audit").run
    assert run is not None and run.app == "audit_jobs.stream:events"
    assert run.trigger_args == {"processingTime": "1 second"}
    assert run.spark_conf == {"spark.sql.shuffle.partitions": "4"}
    assert run.lease_from == "pipelines.audit.run.lease_dsn"


def test_the_logic_version_is_the_app_unless_named(tmp_path: Path) -> None:
    from reconcile.cli.config_sinks import cycle_builder

    assert run_of(tmp_path, MINIMAL + RUN).logic == "shop.stream:orders"
    named = run_of(tmp_path, MINIMAL + RUN + 'logic_version = "2026-11-fix"\n')
    assert (named.logic, named.app) == ("2026-11-fix", "shop.stream:orders")
    config = load_config(write(tmp_path, MINIMAL + RUN + 'logic_version = "v2"\n'), env=ENV)
    cycle = cycle_builder(config.pipeline("orders"))()
    try:
        assert cycle.logic_version == "v2"  # what the cycle's start() checks
    finally:
        cycle.close()
    with pytest.raises(Exception, match="logic_version"):
        run_of(tmp_path, MINIMAL + RUN + 'logic_version = ""\n')


def test_the_rebuild_input_is_a_path_from_the_files_folder(tmp_path: Path) -> None:
    assert run_of(tmp_path, MINIMAL + RUN).rebuild_input == ""
    run = run_of(tmp_path, MINIMAL + RUN + 'rebuild_input = "archive/orders"\n')
    assert run.rebuild_input == str((tmp_path / "archive" / "orders").resolve())
