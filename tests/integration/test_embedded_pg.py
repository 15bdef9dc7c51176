"""The embedded server the demo and the benchmarks start: password, loopback only, cleaned up."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import psycopg
import pytest

from reconcile.demo.embedded_pg import TEMPLATE_CACHE_ENV, start_server

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.integration


def test_a_throwaway_server_needs_its_password_and_leaves_nothing_behind() -> None:
    with start_server() as server:
        root = server.root
        with psycopg.connect(server.dsn(), autocommit=True) as conn:
            assert conn.execute("SELECT current_setting('listen_addresses')").fetchone() == (
                "127.0.0.1",
            )
        wrong = server.dsn().replace(f"password={server.password}", "password=wrong")
        with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
            psycopg.connect(wrong)
        assert server.password not in repr(server.__dict__.get("settings"))
    assert not root.exists()


def test_keep_leaves_it_running_until_stopped() -> None:
    with start_server(keep=True) as server:
        pass
    try:
        with psycopg.connect(server.dsn()) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        server.stop()
    assert not server.root.exists()


SERVE = """
from pathlib import Path
from reconcile.demo.embedded_pg import EmbeddedPostgres
server = EmbeddedPostgres()
with server.connect() as conn:
    assert conn.execute("SELECT 1").fetchone() == (1,)
print((server.data / "kept-here").exists())
server.stop()
"""


def _serve(cache: Path) -> subprocess.Popen[str]:
    env = {**os.environ, TEMPLATE_CACHE_ENV: str(cache)}
    return subprocess.Popen([sys.executable, "-c", SERVE], env=env, cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip


def _said(proc: subprocess.Popen[str]) -> str:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    return out.strip()


def test_processes_that_start_together_keep_one_template_and_later_ones_copy_it() -> None:
    # Not under pytest's temp folder: initdb runs as the postgres user, who must reach
    # the folder (as in a venv), and pytest's folders are the running user's alone.
    top = Path(tempfile.mkdtemp(prefix="reconcile-tpl-test-"))
    top.chmod(0o755)
    try:
        _keep_one_template(top / "cache")
    finally:
        shutil.rmtree(top, ignore_errors=True)


def _keep_one_template(cache: Path) -> None:
    # Two processes find no template: each makes one, one rename wins, both serve.
    assert [_said(p) for p in [_serve(cache), _serve(cache)]] == ["False", "False"]
    (kept,) = list(cache.iterdir())  # no half-made folder left behind
    (kept / "data" / "kept-here").touch()
    before = cache.stat().st_mtime_ns
    # A later process copies the kept one instead of running initdb again: it made no
    # folder of its own in the cache (which would change the folder's mtime).
    assert _said(_serve(cache)) == "True"
    assert list(cache.iterdir()) == [kept] and cache.stat().st_mtime_ns == before
