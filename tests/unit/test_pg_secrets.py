"""Secrets of Postgres connections: decoded once, never in a repr, an error or a registry text."""

from __future__ import annotations

import pytest

from reconcile.core.contract import ConfigurationError
from sinks.postgres.connection import PgTarget, redact_text
from sinks.postgres.factory import postgres_sink
from sinks.registry import open_sink, redact_uri
from sinks.sql.errors import redact_url
from sinks.sql.sink import SqlSink

# A password whose literal text contains a percent escape: '%41' is NOT 'A'.
LITERAL = "S3cr%41et"
ENCODED = "S3cr%2541et"  # how it is written inside a URI


@pytest.mark.parametrize(
    "url",
    [
        f"postgresql://app:{ENCODED}@db:5432/shop",
        f"postgresql+psycopg://app:{ENCODED}@db:5432/shop",
        f"postgres://app@db/shop?password={ENCODED}",
    ],
)
def test_uri_passwords_are_percent_decoded_exactly_once(url: str) -> None:
    target = PgTarget.parse(url)
    assert target.password == LITERAL
    assert f"password={LITERAL}" in target.conninfo() or f"password='{LITERAL}'" in (
        target.conninfo()
    )
    # Redaction finds the password in both forms it can appear in.
    for shown in (url, f"failed for {LITERAL}", f"password={ENCODED} host=db"):
        assert LITERAL not in target.redact(shown) and ENCODED not in target.redact(shown)


def test_key_value_dsn_keeps_the_password_as_written() -> None:
    assert PgTarget.parse(f"host=db dbname=shop user=app password='{LITERAL}'").password == LITERAL


def test_sslpassword_is_a_secret_too() -> None:
    target = PgTarget.parse("host=db dbname=shop user=app password=Pw-One sslpassword=Key-Two")
    sink = postgres_sink(target, "orders", name="orders")
    for shown in (repr(target), str(target), repr(sink), target.describe()):
        assert "Pw-One" not in shown and "Key-Two" not in shown, shown
    assert "sslpassword" in repr(target)  # named, value hidden
    assert "Key-Two" in target.conninfo()  # still reaches libpq
    assert "Key-Two" not in target.redact("could not decrypt key with Key-Two")
    uri = PgTarget.parse("postgresql://app@db/shop?sslpassword=Key-Two&password=Pw-One")
    assert "Key-Two" not in repr(uri) and "Pw-One" not in repr(uri)
    assert "Key-Two" not in redact_text("postgresql://db/x?sslpassword=Key-Two&sslmode=require")


def test_registry_errors_never_show_a_password() -> None:
    with pytest.raises(ConfigurationError) as err:
        open_sink("s", "ftp://app:Hunter-Two@host/x?password=Hunter-Three&mode=a")
    message = str(err.value)
    assert "Hunter" not in message
    assert "ftp://app:***@host/x?password=***&mode=a" in message
    with pytest.raises(ConfigurationError) as remote:
        open_sink("s", "file://app:Hunter-Two@otherhost/path")
    assert "Hunter" not in str(remote.value) and "must be local" in str(remote.value)
    assert redact_uri("postgresql://u@h/db?sslpassword=k&table=t") == (
        "postgresql://u@h/db?sslpassword=***&table=t"
    )
    # A URI no parser takes (a bad IPv6 host) is redacted all the same: by its shape.
    assert (
        redact_uri("http://u:Hunter-Four@[::1/x?token=Hunter-Five")
        == "http://u:***@[::1/x?token=***"
    )


@pytest.mark.parametrize(
    ("dsn", "says"),
    [
        ("postgresql://app:Hunter Two@db/shop", 'unexpected spaces found in "..."'),
        ("postgresql://app:Hunter%zzTwo@db/shop", 'invalid percent-encoded token: "..."'),
        ("host=db password=Hunter Two dbname=shop", 'missing "=" after "..."'),
        ("host=db password='Hunter Two dbname=shop", "unterminated quoted string"),
        ("postgresql://app:Hunter@Two@db/shop", "its host holds an '@'"),
        ("postgresql://app@Hunter:Two@db/shop", "its port holds an '@'"),
    ],
)
def test_a_connection_string_that_cannot_be_used_is_never_echoed(dsn: str, says: str) -> None:
    # libpq's parse errors quote the fragment they choke on, and a password
    # with an unencoded '@' leaves its tail in the host, which every message shows.
    with pytest.raises(ConfigurationError) as err:
        PgTarget.parse(dsn)
    assert says in str(err.value) and "not shown" in str(err.value)
    assert "Hunter" not in str(err.value) and "Two" not in str(err.value)


def test_an_at_sign_percent_encoded_in_the_user_info_is_the_password() -> None:
    target = PgTarget.parse("postgresql://app:Hunter%40Two@db/shop")
    assert target.password == "Hunter@Two" and target.describe() == "app@db/shop"
    assert "Two" not in target.redact("auth failed for Hunter@Two (Hunter%40Two)")


@pytest.mark.parametrize(
    "url",
    [
        "postgresql+psycopg://app:Hunter@Two@db/shop",
        "not a url Hunter-Two",
    ],
)
def test_a_sql_url_that_cannot_be_used_is_never_echoed(url: str) -> None:
    with pytest.raises(ConfigurationError) as err:
        SqlSink(url, "orders", name="orders")
    assert "not shown" in str(err.value) and "Hunter" not in str(err.value)
    assert "Two" not in str(err.value)
    assert "Two" not in redact_url(url) and "Hunter" not in redact_url(url)
