"""``reconcile run``'s checks of its config and app, before any Spark query runs.

A bad config or app is one line on stderr and exit 2; what the app returns is
checked (a streaming DataFrame, and outputs only for the pipeline's sinks); an
app that fails at import or when called never prints the password, not even
in the debug log's traceback.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from reconcile.cli.config import PipelineConfig, load_config
from reconcile.cli.run import call_app
from reconcile.core.contract import ConfigurationError
from tests.cli_run import REPO
from tests.fix_pg import PASSWORD
from tests.integration.test_cli_run import CONFIG, run_env

pytestmark = [pytest.mark.integration]


def test_a_bad_config_or_app_is_one_line_and_exit_2(tmp_path: Path) -> None:
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "broken_app.py").write_text("import no_such_dependency\n")
    config = tmp_path / "reconcile.toml"
    base = CONFIG.format(dsn="host=127.0.0.1 dbname=x user=u")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(tmp_path / "app")]),
           "RUN_PG_PASSWORD": PASSWORD}  # fmt: skip
    cases = [
        (base.replace("lease_term_s = 2", "lease_term_s = 0"),
         "pipelines.orders.run.lease_term_s: must be > 0, got 0"),
        (base.replace("[pipelines.orders.run]", "[pipelines.orders.runn]"),
         "pipelines.orders.runn: unknown key (did you mean 'run'?)"),
        (base.replace('"ha_test_app:lines"', '"no_such_app:lines"'),
         "pipelines.orders.run.app: 'no_such_app:lines': cannot import no_such_app"),
        (base.replace('"ha_test_app:lines"', '"broken_app:lines"'),
         "'broken_app:lines': cannot import broken_app: No module named 'no_such_dependency'"),
        (base.replace('"ha_test_app:lines"', '"json:nothing"'),
         "pipelines.orders.run.app: 'json:nothing': module json has no 'nothing'"),
        (base.replace('dsn = "host', 'url = "sqlite:///x.db"\n# "host', 1).replace(
            'password_env = "RUN_PG_PASSWORD"\n', "", 1),
         "pipelines.orders.sinks.lines.url: sqlite:///x.db: reconcile run writes Postgres sinks"),
    ]  # fmt: skip
    for text, expected in cases:
        config.write_text(text)
        done = subprocess.run(
            [sys.executable, "-m", "reconcile.cli", "run", "--config", str(config), "--pipeline",
             "orders"], capture_output=True, text=True, cwd=REPO, env=env, timeout=120,
        )  # fmt: skip
        assert done.returncode == 2, done.stderr
        assert done.stderr.startswith(f"reconcile: error: {config}: "), done.stderr
        assert expected in done.stderr and done.stderr.count("\n") == 1, done.stderr
        assert PASSWORD not in done.stderr + done.stdout


def pipeline_config(tmp_path: Path) -> PipelineConfig:
    config = tmp_path / "reconcile.toml"
    config.write_text(CONFIG.format(dsn="host=127.0.0.1 dbname=x user=u"))
    return load_config(config, env={"RUN_PG_PASSWORD": "x"}).pipeline("orders")


def test_what_the_app_returns_is_checked(spark: Any, tmp_path: Path) -> None:
    pipeline = pipeline_config(tmp_path)
    stream = spark.readStream.format("rate").load()
    assert call_app(lambda s, p: stream, spark, pipeline) == (stream, None)
    df, outputs = call_app(lambda s, p: (stream, {"evens": len}), spark, pipeline)
    assert df is stream and outputs is not None and outputs["evens"] is len
    assert outputs["lines"](stream) is stream  # a sink left out: the batch as it is
    bad: list[tuple[Callable[[Any, Any], Any], str]] = [
        (lambda s, p: s.range(3), "app: returned a batch DataFrame, not a streaming DataFrame"),
        (lambda s, p: None, "app: returned NoneType, not a streaming DataFrame"),
        (lambda s, p: (stream, {"nope": len}), "outputs for sink 'nope', which pipeline 'orders'"),
        (lambda s, p: (stream, {"lines": 1}), "'lines' is not a function of the micro-batch"),
        (lambda s, p: (stream, [len]), "returned are not a dict {sink name: transform} (got list)"),
        (lambda s, p: (stream, {}, 1), "app: returned a tuple of 3"),
        (lambda s, p: 1 / 0, "app: raised ZeroDivisionError: division by zero"),
    ]  # fmt: skip
    for app, expected in bad:
        with pytest.raises(ConfigurationError) as err:
            call_app(app, spark, pipeline)
        assert expected in str(err.value)


BROKEN_AT_IMPORT = """
import os
raise RuntimeError("cannot log in with " + os.environ["RUN_PG_PASSWORD"])
"""

BROKEN_WHEN_CALLED = """
import os


def lines(spark, pipeline):
    raise ValueError("the source refused " + os.environ["RUN_PG_PASSWORD"] + " as a token")
"""


@pytest.mark.spark  # in a subprocess
def test_an_app_that_fails_never_prints_the_password(tmp_path: Path) -> None:
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "at_import.py").write_text(BROKEN_AT_IMPORT)
    (tmp_path / "app" / "when_called.py").write_text(BROKEN_WHEN_CALLED)
    base = (
        CONFIG.format(dsn="host=127.0.0.1 port=9 dbname=x user=u") + '\n[logs]\nlevel = "DEBUG"\n'
    )
    config = tmp_path / "reconcile.toml"
    for app, said in (("at_import:lines", "importing at_import raised RuntimeError: cannot log "
                       "in with ***"),
                      ("when_called:lines", "raised ValueError: the source refused *** as a "
                       "token")):  # fmt: skip
        config.write_text(base.replace('"ha_test_app:lines"', f'"{app}"'))
        done = subprocess.run(
            [sys.executable, "-m", "reconcile.cli", "run", "--config", str(config), "--pipeline",
             "orders"], capture_output=True, text=True, cwd=REPO, env=run_env(tmp_path),
            timeout=180,
        )  # fmt: skip
        assert done.returncode == 2, done.stderr[-3000:]
        assert PASSWORD not in done.stdout + done.stderr, app
        last = done.stderr.strip().splitlines()[-1]
        assert last.startswith(f"reconcile: error: {config}: pipelines.orders.run.app"), last
        assert said in last, last
    # The debug log had the traceback, redacted too.
    assert "Traceback" in done.stderr and "ValueError: the source refused ***" in done.stderr
