"""Opening sinks by URI: every scheme, and clear errors for the wrong ones."""

from __future__ import annotations

from pathlib import Path

import pytest

from reconcile.core.contract import ConfigurationError
from sinks.delta import DeltaSink
from sinks.files import FileSink
from sinks.http import HttpSink
from sinks.memory import MemorySink
from sinks.postgres import PostgresSink, PreparedPostgresSink
from sinks.registry import open_sink, register


def test_each_builtin_scheme(tmp_path: Path) -> None:
    assert isinstance(open_sink("m", "memory://a"), MemorySink)
    assert open_sink("m", "memory://a").store is open_sink("n", "memory://a").store  # type: ignore[attr-defined]
    assert isinstance(open_sink("f", f"file://{tmp_path}"), FileSink)
    assert isinstance(open_sink("h", "http://127.0.0.1:9/base"), HttpSink)
    assert isinstance(open_sink("d", f"delta://{tmp_path}/delta"), DeltaSink)
    pg = open_sink("orders", "postgresql://app:s3cret@127.0.0.1:5432/shop?connect_timeout=3")
    assert isinstance(pg, PostgresSink) and not isinstance(pg, PreparedPostgresSink)
    assert "s3cret" not in repr(pg)
    prepared = open_sink("o", "postgresql+psycopg://app@127.0.0.1/shop?table=t&mode=prepared")
    assert isinstance(prepared, PreparedPostgresSink)


def test_unknown_scheme_and_remote_file_uri_are_rejected() -> None:
    with pytest.raises(ConfigurationError, match=r"unknown scheme in 'ftp://x'.*known"):
        open_sink("s", "ftp://x")
    with pytest.raises(ConfigurationError, match="must be local"):
        open_sink("s", "file://otherhost/path")
    with pytest.raises(ConfigurationError, match="mode must be"):
        open_sink("s", "postgresql://h/db?mode=xa")


def test_register_adds_a_scheme() -> None:
    register("mine", lambda name, uri: MemorySink(name, open_sink("x", "memory://r").store))  # type: ignore[attr-defined]
    assert isinstance(open_sink("s", "mine://anything"), MemorySink)
