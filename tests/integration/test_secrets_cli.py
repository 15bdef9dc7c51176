"""No secret of a config file or a sink URI reaches stdout, stderr or a log, in any form.

Real ``reconcile`` processes, as cron or an operator runs them: ``verify`` and
``watch`` with ``--config`` (with and without ``--json``) and with ``--pg``,
on an Iceberg sink URI whose ``credential=`` and ``s3.secret-access-key=``
must be hidden when its error shows the URI, also when the scheme is
mistyped (the URI then goes to the SQL sink, which shows it); and ``reconcile
run`` with an app that raises with its password in repr, JSON and base64
form. Each secret is looked for as written and in every such form.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli_run import REPO, cli

pytestmark = pytest.mark.integration

# Secrets with characters that repr and JSON escape, and percent-encoding changes.
CREDENTIAL = 'client-id:Cr3d"ent\\ial'
ACCESS_KEY = "S3cr3t/Acc+ss=K3y"
PASSWORD = "pa'ss\"w\\ord-é-42"


def shown_forms(secret: str) -> list[str]:
    """What a leak of ``secret`` would look like: as written, escaped, encoded."""
    from urllib.parse import quote

    raw = secret.encode()
    return [
        secret,
        repr(secret)[1:-1],
        json.dumps(secret)[1:-1],
        quote(secret, safe=""),
        base64.b64encode(raw).decode().rstrip("="),
        base64.b64encode(b"user:" + raw).decode().rstrip("=")[8:],
    ]


def assert_hidden(text: str, *secrets: str) -> None:
    for secret in secrets:
        for form in shown_forms(secret):
            assert form not in text, (form, text)


def iceberg_url(scheme: str = "iceberg", extra: str = "") -> str:
    from urllib.parse import quote

    return (
        f"{scheme}://cat?type=rest&uri=http://127.0.0.1:9/&credential={quote(CREDENTIAL, safe='')}"
        f"&s3.secret-access-key={quote(ACCESS_KEY, safe='')}{extra}"
    )


def config_file(tmp_path: Path, url: str) -> Path:
    (tmp_path / "store").mkdir(exist_ok=True)
    config = tmp_path / "reconcile.toml"
    config.write_text(
        f"""
[store]
root = "{tmp_path / "store"}"

[pipelines.p.sinks.t]
url = {json.dumps(url)}
table = "ns.t"
keys = ["id"]
"""
    )
    return config


def test_a_uri_secret_is_hidden_from_verify_watch_and_the_command_line(tmp_path: Path) -> None:
    # The default tier's representative of the two tests below (each process
    # costs seconds): one verify --json, one watch, one --pg, each path once.
    runs = [
        cli("verify", "--config", str(config_file(tmp_path, iceberg_url(extra="&namespace="))),
            "--all", "--json"),
        cli("watch", "--config", str(config_file(tmp_path, iceberg_url(scheme="icebreg"))),
            "--count", "1", "--every", "1s"),
        cli("verify", "--pg", iceberg_url(scheme="icebreg"), "--store", str(tmp_path),
            "--pipeline", "p", "--table", "t"),
    ]  # fmt: skip
    for done in runs:
        assert done.returncode == 2, done.stdout + done.stderr
        said = done.stdout + done.stderr
        assert "credential=***" in said and "s3.secret-access-key=***" in said, said
        assert_hidden(said, CREDENTIAL, ACCESS_KEY)


@pytest.mark.slow
@pytest.mark.parametrize(
    "url",
    [
        # An Iceberg URI whose error shows it (an empty sink option).
        iceberg_url(extra="&namespace="),
        # A mistyped scheme: the URI goes to the SQL sink, whose error shows it.
        iceberg_url(scheme="icebreg"),
    ],
    ids=["iceberg", "mistyped-scheme"],
)
def test_verify_and_watch_with_a_config_never_show_a_uri_secret(tmp_path: Path, url: str) -> None:
    config = config_file(tmp_path, url)
    runs = [
        cli("verify", "--config", str(config), "--all"),
        cli("verify", "--config", str(config), "--all", "--json"),
        cli("watch", "--config", str(config), "--count", "1", "--every", "1s"),
        cli("watch", "--config", str(config), "--count", "1", "--every", "1s", "--json"),
    ]
    for done in runs:
        assert done.returncode == 2, done.stdout + done.stderr
        said = done.stdout + done.stderr
        # The error is there, naming the URI with its secrets replaced.
        assert "credential=***" in said and "s3.secret-access-key=***" in said, said
        assert_hidden(said, CREDENTIAL, ACCESS_KEY)


@pytest.mark.slow
def test_verify_with_a_mistyped_scheme_on_the_command_line(tmp_path: Path) -> None:
    for pg in (iceberg_url(scheme="icebreg"), iceberg_url(scheme="nosuch+driver")):
        for flags in ((), ("--json",)):
            done = cli("verify", "--pg", pg, "--store", str(tmp_path), "--pipeline", "p",
                       "--table", "t", *flags)  # fmt: skip
            assert done.returncode == 2, done.stderr
            said = done.stdout + done.stderr
            assert "reconcile: error:" in said
            assert_hidden(said, CREDENTIAL, ACCESS_KEY)


APP = """
import base64, json, os

pw = os.environ["RUN_PG_PASSWORD"]
raise RuntimeError(
    "cannot log in: " + repr({"password": pw}) + " " + json.dumps([pw]) + " "
    + base64.b64encode(("user:" + pw).encode()).decode() + " " + repr(pw)
)
"""

RUN_CONFIG = """
[store]
root = "expected"

[logs]
level = "DEBUG"

[pipelines.orders.sinks.lines]
dsn = "host=127.0.0.1 port=9 dbname=x user=u"
password_env = "RUN_PG_PASSWORD"
table = "lines"
keys = ["id"]

[pipelines.orders.run]
app = "leaky_app:lines"
checkpoint = "checkpoint"
"""


def test_run_never_prints_the_apps_password_in_repr_json_or_base64(tmp_path: Path) -> None:
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "leaky_app.py").write_text(APP)
    config = tmp_path / "reconcile.toml"
    config.write_text(RUN_CONFIG)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(tmp_path / "app")]),
           "RUN_PG_PASSWORD": PASSWORD}  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "reconcile.cli", "run", "--config", str(config), "--pipeline",
         "orders"], capture_output=True, text=True, cwd=REPO, env=env, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    # The app's error is said, and the debug log had its traceback: both redacted.
    assert "importing leaky_app raised RuntimeError: cannot log in: {'password': '***'}" in last
    assert "Traceback" in done.stderr, done.stderr
    assert_hidden(done.stdout + done.stderr, PASSWORD)
