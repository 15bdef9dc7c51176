"""The embedded server the demo and the benchmarks start: password, loopback only, cleaned up."""

from __future__ import annotations

import psycopg
import pytest

from reconcile.demo.embedded_pg import start_server

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
