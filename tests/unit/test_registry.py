"""Opening sinks by URI: every backend declares itself, and the registry is how callers pick one."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

import sinks
from reconcile.core.contract import ConfigurationError
from sinks import registry
from sinks.base import LEASE, PULLABLE, SHARED_STAGE, SPARK_PULL, TABLE_SINK
from sinks.delta.factory import pullable_sink as delta_pullable_sink
from sinks.delta.sink import DeltaSink
from sinks.files.sink import FileSink
from sinks.http.sink import HttpSink
from sinks.iceberg.factory import pullable_sink
from sinks.iceberg.sink import IcebergSink
from sinks.kafka.recovery import pullable_sink as kafka_pullable_sink
from sinks.memory.sink import MemorySink
from sinks.postgres.factory import postgres_sink
from sinks.postgres.lease import PgLease
from sinks.postgres.prepared import PreparedPostgresSink
from sinks.postgres.sink import PostgresSink
from sinks.registry import open_sink, register
from sinks.sql.sink import SqlSink

REPO = Path(__file__).resolve().parents[2]


def test_each_builtin_scheme(tmp_path: Path) -> None:
    assert isinstance(open_sink("m", "memory://a"), MemorySink)
    assert open_sink("m", "memory://a").store is open_sink("n", "memory://a").store  # type: ignore[attr-defined]
    assert isinstance(open_sink("f", f"file://{tmp_path}"), FileSink)
    assert isinstance(open_sink("h", "http://127.0.0.1:9/base"), HttpSink)
    assert isinstance(open_sink("d", f"delta://{tmp_path}/delta"), DeltaSink)
    assert registry.backend_for(f"delta+spark://{tmp_path}/delta?key=id").name == "delta_spark"
    iceberg = open_sink("i", f"iceberg://cat?type=sql&uri=sqlite:///{tmp_path}/c.db&key=id")
    assert isinstance(iceberg, IcebergSink) and iceberg.display == "cat.reconcile.i"
    pg = open_sink("orders", "postgresql://app:s3cret@127.0.0.1:5432/shop?connect_timeout=3")
    assert isinstance(pg, PostgresSink) and not isinstance(pg, PreparedPostgresSink)
    assert "s3cret" not in repr(pg)
    prepared = open_sink("o", "postgresql+psycopg://app@127.0.0.1/shop?table=t&mode=prepared")
    assert isinstance(prepared, PreparedPostgresSink)
    sql = open_sink("lines", f"sqlite:///{tmp_path}/shop.db?table=order_lines")
    assert isinstance(sql, SqlSink) and sql.table_name == "order_lines"


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


def test_every_backend_package_declares_itself() -> None:
    # The registry has no table of its own: what it knows is what the
    # packages under sinks/ declare, one backend per package with a backend module.
    declared = {p.parent.name for p in (REPO / "sinks").glob("*/backend.py")}
    assert {b.name for b in registry.backends()} == declared
    assert declared == {
        "delta", "delta_spark", "files", "http", "iceberg", "kafka", "memory", "postgres", "s3",
        "sql",
    }  # fmt: skip
    for backend in registry.backends():
        assert backend.schemes or backend.accepts is not None, backend.name
        # Every reference names something that exists (the extras are installed here).
        for reference in [backend.open, *backend.capabilities.values()]:
            assert registry._load(backend, reference) is not None, reference


def test_a_connection_string_finds_its_backend() -> None:
    by = {c: registry.backend_for(c).name for c in (
        "host=db dbname=shop user=app",  # libpq key=value
        "postgresql://app@db/shop",
        "postgres://app@db/shop",
        "postgresql+psycopg2://app@db/shop",  # SQLAlchemy's form: still Postgres
        "sqlite:///tmp/x.db",
        "mysql+pymysql://app@db/shop",
    )}  # fmt: skip
    assert by == {
        "host=db dbname=shop user=app": "postgres",
        "postgresql://app@db/shop": "postgres",
        "postgres://app@db/shop": "postgres",
        "postgresql+psycopg2://app@db/shop": "postgres",
        "sqlite:///tmp/x.db": "sql",
        "mysql+pymysql://app@db/shop": "sql",
    }
    with pytest.raises(ConfigurationError, match="unknown scheme") as caught:
        registry.backend_for("ftp://app:hunter2@host/x")
    assert "hunter2" not in str(caught.value)


def test_capabilities_come_from_the_backend_of_the_connection() -> None:
    pg, lite = "postgresql://app@db/shop", "sqlite:///tmp/x.db"
    assert registry.capability(pg, PULLABLE) is PostgresSink
    assert registry.capability(pg, SPARK_PULL) is PostgresSink
    assert registry.capability(pg, TABLE_SINK) is postgres_sink
    assert registry.capability(pg, LEASE) is PgLease
    assert registry.capability(lite, PULLABLE) is SqlSink
    assert registry.capability("iceberg://cat?type=sql", PULLABLE) is pullable_sink
    assert registry.capability("kafka://broker:9092", PULLABLE) is kafka_pullable_sink
    for delta in ("delta:///lake?key=id", "delta+spark:///lake?key=id"):
        assert registry.capability(delta, PULLABLE) is delta_pullable_sink
    # Without the fast path, Postgres too goes through the generic backend (SQLAlchemy).
    assert registry.capability(pg, PULLABLE, generic=True) is SqlSink
    assert registry.provides(pg, LEASE) and not registry.provides(lite, LEASE)
    assert not registry.provides("ftp://x", PULLABLE)
    assert registry.preload(SHARED_STAGE) == ["postgres"]
    with pytest.raises(ConfigurationError, match=r"sql sinks do not provide lease.*\[.postgres.\]"):
        registry.capability(lite, LEASE)
    with pytest.raises(ConfigurationError, match=r"memory sinks do not provide pullable"):
        registry.capability("memory://x", PULLABLE)


@pytest.fixture
def toy_backend(tmp_path: Path) -> Iterator[None]:
    """A backend package that exists only outside the repository, on the sinks package's path."""
    package = tmp_path / "toy"
    package.mkdir()
    (package / "__init__.py").write_text('"""A toy backend."""\n')
    (package / "backend.py").write_text(textwrap.dedent("""\
        from sinks.base import Backend

        BACKEND = Backend(name="toy", schemes=("toy",), open="sinks.toy.backend:open_uri")


        def open_uri(name, uri):
            from sinks.memory.sink import MemorySink, MemoryStore

            return MemorySink(name, MemoryStore())
        """))  # fmt: skip
    sinks.__path__.append(str(tmp_path))
    registry.backends.cache_clear()
    try:
        yield
    finally:
        sinks.__path__.remove(str(tmp_path))
        for name in [m for m in sys.modules if m == "sinks.toy" or m.startswith("sinks.toy.")]:
            del sys.modules[name]
        registry.backends.cache_clear()


def test_a_backend_package_is_found_by_its_declaration_alone(toy_backend: None) -> None:
    assert "toy" in {b.name for b in registry.backends()}
    assert isinstance(open_sink("t", "toy://anything"), MemorySink)


# Run in a fresh interpreter where the optional extras' modules cannot be
# imported (a sys.modules entry of None makes `import` fail), as on an install
# without them. Prints one JSON object of what happened.
_WITHOUT_EXTRAS = """
import json, sys
for module in sys.argv[1].split(","):
    sys.modules[module] = None
out = {}
import reconcile, reconcile.cli.command, reconcile.cli.watch, reconcile.cli.recover
from reconcile import CommitCycle, recover
from sinks.registry import open_sink
out["memory"] = type(open_sink("m", "memory://x")).__name__
def error(call):
    try:
        call()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None
out["postgres"] = error(lambda: open_sink("s", "postgresql://app:pw@127.0.0.1:9/shop"))
out["sql"] = error(lambda: open_sink("s", "sqlite:///x.db"))
out["recover"] = error(lambda: recover("postgresql://127.0.0.1:9/x", "/nowhere", "p", "t"))
out["spark"] = error(lambda: __import__("reconcile.spark"))
out["ha"] = error(lambda: __import__("reconcile.ha"))
print(json.dumps(out))
"""


def _without(*modules: str) -> dict[str, str | None]:
    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT_EXTRAS, ",".join(modules)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, str | None] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_a_missing_extra_is_an_error_that_names_it() -> None:
    out = _without("psycopg", "adbc_driver_postgresql", "sqlalchemy", "pyspark", "pandas")
    # The base install runs the engine, recovery's entry points and the plain sinks.
    assert out["memory"] == "MemorySink"
    for key, extra in (("postgres", "postgres"), ("recover", "postgres"), ("sql", "sql"),
                       ("spark", "spark"), ("ha", "postgres")):  # fmt: skip
        said = out[key]
        assert said is not None and said.startswith("ConfigurationError: "), (key, said)
        assert f"pip install 'reconcile-engine[{extra}]'" in said, (key, said)
    assert "pw" not in str(out["postgres"])


def test_the_postgres_sink_needs_no_spark() -> None:
    out = _without("pyspark", "pandas", "sqlalchemy")
    assert out["postgres"] is None  # built (it connects when bound)
    assert out["spark"] is not None and "reconcile-engine[spark]" in out["spark"]
    assert out["sql"] is not None and "reconcile-engine[sql]" in out["sql"]


@pytest.mark.parametrize("uri", ["file:///tmp/t", "http://127.0.0.1:9/base", "memory://t"])
def test_verify_refuses_a_sink_it_cannot_pull_from_by_name(uri: str, tmp_path: Path) -> None:
    # Not a database: the generic SQL driver cannot reach it either, so the refusal names
    # the sink's kind and the kinds that can be pulled from, rather than an SQL dialect.
    from reconcile.recovery import recover

    kind = uri.split(":", 1)[0].replace("+", "_")
    kind = {"file": "files"}.get(kind, kind)
    with pytest.raises(ConfigurationError, match=rf"the {kind} sinks do not provide pullable"):
        recover(uri, str(tmp_path), "shop", "orders", mode="full")
