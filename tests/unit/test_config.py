"""The config file: the example loads, errors name the file and the key, secrets never show."""

from __future__ import annotations

import dataclasses
import textwrap
from pathlib import Path

import pytest

from reconcile.cli.config import ConfigFileError, load_config
from reconcile.core.contract import ConfigurationError
from sinks.postgres.connection import PgTarget

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "reconcile.toml"
SECRET = "s3cr3t-Pa55w0rd"
ENV = {"PG_PASSWORD": SECRET, "AUDIT_PG_PASSWORD": "audit-" + SECRET}

MINIMAL = """
[store]
root = "expected"

[pipelines.orders.sinks.lines]
dsn = "postgresql://app@db:5432/shop"
password_env = "PG_PASSWORD"
table = "order_lines"
keys = ["order_id", "line_no"]
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "reconcile.toml"
    path.write_text(textwrap.dedent(text))
    return path


def load_error(tmp_path: Path, text: str, env: dict[str, str] | None = None) -> str:
    path = write(tmp_path, text)
    with pytest.raises(ConfigFileError) as err:
        load_config(path, env=ENV if env is None else env)
    message = str(err.value)
    assert message.startswith(f"{path}: "), message
    assert SECRET not in message and SECRET not in repr(err.value)
    return message


def test_the_example_file_loads_with_every_table() -> None:
    config = load_config(EXAMPLE, env=ENV)
    assert [p.name for p in config.pipelines] == ["orders", "audit"]
    assert [(t.pipeline, t.name) for t in config.tables()] == [
        ("orders", "lines"),
        ("orders", "totals"),
        ("audit", "events"),
    ]
    lines = config.pipeline("orders").sink("lines")
    assert lines.table == "public.order_lines" and lines.keys == ("order_id", "line_no")
    assert (lines.mode, lines.write_mode) == ("auto", "transactional")
    assert lines.store == str(ROOT / "examples" / "state" / "expected")
    assert lines.progress == ROOT / "examples" / "state" / "progress"
    events = next(config.tables("audit"))
    assert events.mode == "buckets" and events.store.endswith("state/audit-expected")
    assert config.metrics is not None and config.metrics.port == 9464
    assert config.metrics.addr == "127.0.0.1" and config.metrics.textfile is None
    assert config.logs.json is True and config.logs.level == "INFO"


def test_the_password_reaches_the_connection_string_and_nothing_else() -> None:
    config = load_config(EXAMPLE, env=ENV)
    lines = config.pipeline("orders").sink("lines")
    totals = config.pipeline("orders").sink("totals")
    # Filled in structurally (libpq key=value), and as ${VAR} in the URL.
    assert f"password={SECRET}" in lines.connection.get_secret_value()
    assert f":{SECRET}@" in totals.connection.get_secret_value()
    for shown in (repr(config), str(config), repr(lines), str(lines.connection), repr(totals)):
        assert SECRET not in shown
    assert str(lines.connection) == (
        "postgresql://reconcile@localhost:5432/shop (password from $PG_PASSWORD)"
    )
    assert "${PG_PASSWORD}" not in str(totals.connection)  # a literal userinfo password: ***
    assert str(totals.connection) == "postgresql+psycopg://reconcile:***@localhost:5432/shop"
    # A driver message that echoes the connection string is redacted.
    echoed = f"could not connect: {totals.connection.get_secret_value()} refused"
    assert SECRET not in totals.connection.redact(echoed)


def test_the_model_is_frozen(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, MINIMAL), env=ENV)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.pipelines[0].sinks[0].table = "other"  # type: ignore[misc]


def test_a_wrong_type_names_the_file_table_and_key(tmp_path: Path) -> None:
    message = load_error(tmp_path, MINIMAL.replace('table = "order_lines"', "table = 42"))
    assert message.endswith("pipelines.orders.sinks.lines.table: expected a string, got int")


def test_a_wrong_type_of_a_secret_does_not_show_its_value(tmp_path: Path) -> None:
    text = MINIMAL.replace(
        'password_env = "PG_PASSWORD"', f'password_env = ["{SECRET}"]'
    )  # a password pasted where the variable's name belongs
    message = load_error(tmp_path, text)
    assert "pipelines.orders.sinks.lines.password_env: expected a string, got array" in message


def test_a_literal_password_in_a_bad_dsn_is_not_echoed(tmp_path: Path) -> None:
    # An unquoted password with a space: libpq's own parse error quotes the
    # fragment it choked on ('missing "=" after "<the rest of the password>"').
    text = MINIMAL.replace(
        'dsn = "postgresql://app@db:5432/shop"', f'dsn = "host=db password=p {SECRET} dbname=x"'
    ).replace('password_env = "PG_PASSWORD"\n', "")
    message = load_error(tmp_path, text)
    assert "pipelines.orders.sinks.lines.dsn: not a valid libpq connection string" in message


def test_an_unknown_key_is_refused_with_a_hint(tmp_path: Path) -> None:
    message = load_error(tmp_path, MINIMAL.replace("keys =", "key ="))
    assert "pipelines.orders.sinks.lines.key: unknown key (did you mean 'keys'?)" in message
    message = load_error(tmp_path, MINIMAL + "\n[metrics]\nport = 9000\nprot = 1\n")
    assert "metrics.prot: unknown key" in message
    message = load_error(tmp_path, MINIMAL + "\n[extra]\nx = 1\n")
    assert ": extra: unknown key" in message


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (('keys = ["order_id", "line_no"]', "keys = []"), "lines.keys: expected a non-empty"),
        (('keys = ["order_id", "line_no"]', 'keys = ["a", "a"]'), "listed twice"),
        (('table = "order_lines"\n', ""), "lines.table: is required"),
        (('table = "order_lines"', 'table = "order_lines"\nmode = "fast"'), "lines.mode: expected"),
        (('dsn = "postgresql://app@db:5432/shop"', 'url = "x"\ndsn = "y"'), "exactly one of dsn"),
        (('dsn = "postgresql://app@db:5432/shop"', 'url = "::"'), "not a valid URL"),
        (("[pipelines.orders.sinks.lines]", "[pipelines.orders.sinks.bad-name]"), "bad-name"),
        (('root = "expected"', 'root = ""'), "store.root: must not be empty"),
        (
            ('table = "order_lines"', 'table = "order_lines"\nmax_change_fraction = 1.01'),
            "lines.max_change_fraction: must be from 0 to 1, got 1.01",
        ),
        (
            ('table = "order_lines"', 'table = "order_lines"\nmax_change_fraction = -0.0001'),
            "lines.max_change_fraction: must be from 0 to 1",
        ),
        (
            ('table = "order_lines"', 'table = "order_lines"\nmax_change_fraction = nan'),
            "lines.max_change_fraction: must be from 0 to 1",
        ),
        (
            ('table = "order_lines"', 'table = "order_lines"\nmax_change_fraction = "10%"'),
            "lines.max_change_fraction: expected an integer or a number, got string",
        ),
    ],
)
def test_bad_values_are_named(tmp_path: Path, change: tuple[str, str], expected: str) -> None:
    old, new = change
    assert old in MINIMAL
    assert expected in load_error(tmp_path, MINIMAL.replace(old, new))


def test_the_brake_fraction_defaults_and_takes_its_bounds(tmp_path: Path) -> None:
    lines = load_config(write(tmp_path, MINIMAL), env=ENV).pipeline("orders").sink("lines")
    assert lines.max_change_fraction == 0.1
    for given, got in (("0", 0.0), ("1", 1.0), ("0.25", 0.25)):
        text = MINIMAL.replace('table = "order_lines"',
                               f'table = "order_lines"\nmax_change_fraction = {given}')  # fmt: skip
        sink = load_config(write(tmp_path, text), env=ENV).pipeline("orders").sink("lines")
        assert sink.max_change_fraction == got


def test_an_unset_variable_is_named_and_nothing_loads(tmp_path: Path) -> None:
    message = load_error(tmp_path, MINIMAL, env={})
    assert "lines.password_env: environment variable PG_PASSWORD is not set" in message
    text = MINIMAL.replace("app@db", "app:${DB_PASS}@db").replace(
        'password_env = "PG_PASSWORD"', ""
    )
    assert "lines.dsn: environment variable DB_PASS is not set" in load_error(tmp_path, text)


def test_a_variable_in_a_dsn_is_a_secret(tmp_path: Path) -> None:
    text = MINIMAL.replace("app@db", "app:${DB_PASS}@db").replace(
        'password_env = "PG_PASSWORD"', ""
    )
    config = load_config(write(tmp_path, text), env={"DB_PASS": SECRET})
    connection = config.pipelines[0].sinks[0].connection
    assert f":{SECRET}@" in connection.get_secret_value()
    assert SECRET not in repr(config)
    assert SECRET not in connection.redact(f"error near {SECRET}")


def test_metrics_settings(tmp_path: Path) -> None:
    text = MINIMAL + '\n[metrics]\ntextfile = "out/reconcile.prom"\ninterval_s = 5\n'
    config = load_config(write(tmp_path, text), env=ENV)
    assert config.metrics is not None
    assert config.metrics.textfile == (tmp_path / "out" / "reconcile.prom").resolve()
    assert config.metrics.port is None and config.metrics.interval_s == 5.0
    both = MINIMAL + '\n[metrics]\nport = 1\ntextfile = "a.prom"\n'
    assert "metrics: give exactly one of port or textfile" in load_error(tmp_path, both)
    assert "metrics.port: expected a port" in load_error(
        tmp_path, MINIMAL + "[metrics]\nport=70000"
    )
    assert "expected an integer, got bool" in load_error(tmp_path, MINIMAL + "[metrics]\nport=true")
    bad = MINIMAL + '[metrics]\ntextfile = "a.txt"\n'
    assert "metrics.textfile: must end in .prom" in load_error(tmp_path, bad)


def test_missing_pipelines_store_and_file(tmp_path: Path) -> None:
    assert "pipelines: at least one pipeline" in load_error(tmp_path, '[store]\nroot = "x"\n')
    no_store = MINIMAL.replace('[store]\nroot = "expected"\n', "")
    assert "pipelines.orders.store: no expected-state store" in load_error(tmp_path, no_store)
    with pytest.raises(ConfigFileError, match="cannot read"):
        load_config(tmp_path / "absent.toml")
    assert "not valid TOML" in load_error(tmp_path, "[store\n")


def test_lookups_name_what_exists(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, MINIMAL), env=ENV)
    with pytest.raises(ConfigurationError, match=r"no pipeline 'shop'; it has \['orders'\]"):
        config.pipeline("shop")
    with pytest.raises(ConfigurationError, match=r"no sink 'x'; it has \['lines'\]"):
        config.pipeline("orders").sink("x")
    with pytest.raises(ConfigurationError):
        list(config.tables("shop"))


@pytest.mark.parametrize("secret", ["ab@cd", "ab/cd@ef:gh", "ab%40cd", "p@ss:w0rd#"])
def test_a_variable_in_the_user_info_stays_the_password_whatever_it_holds(
    tmp_path: Path, secret: str
) -> None:
    # Filled in as written, an '@' in it would end the user info early: the
    # password's tail would become the host, and show wherever the host does.
    text = MINIMAL.replace("app@db", "app:${DB_PASS}@db").replace(
        'password_env = "PG_PASSWORD"', ""
    )
    config = load_config(write(tmp_path, text), env={"DB_PASS": secret})
    connection = config.pipelines[0].sinks[0].connection
    target = PgTarget.parse(connection.get_secret_value())
    assert target.password == secret
    assert target.describe() == "app@db:5432/shop"
    shown = connection.redact(f"failed: {connection.get_secret_value()} ({secret})")
    assert secret not in shown and "cd" not in shown


def test_a_config_file_every_user_may_write_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL)
    path.chmod(0o666)
    with pytest.raises(ConfigFileError) as err:
        load_config(path, env=ENV)
    assert str(err.value).startswith(f"{path}: writable by every user (mode -rw-rw-rw-)")
    assert f"chmod go-w {path}" in str(err.value)


def test_a_config_file_its_group_may_write_is_read_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = write(tmp_path, MINIMAL)
    path.chmod(0o664)
    with caplog.at_level("WARNING", logger="reconcile.config"):
        assert load_config(path, env=ENV).pipelines[0].name == "orders"
    assert [r.getMessage() for r in caplog.records] == [
        f"{path}: writable by its group (mode -rw-rw-r--): whoever is in the group can change "
        "where rows go and which code `reconcile run` imports (chmod g-w to stop this warning)"
    ]
    path.chmod(0o644)
    caplog.clear()
    load_config(path, env=ENV)
    assert caplog.records == []
