"""The one redaction (``reconcile.core.redaction``): every scheme the engine knows, and others.

Each case is a text a message, a log line, a repr or a JSON object may carry:
the secret must be gone from it, in every form it can take, and what is not a
secret (a host, a user, the key columns) must still be there to read.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from urllib.parse import quote

import pytest

from reconcile.core.redaction import Redactor, forms, is_secret_name, redact, redact_uri, scrub

SECRET = "Zq9-s3cr3t"

# (text with SECRET, what must still be shown) per scheme and shape.
URIS = [
    (f"postgresql://app:{SECRET}@db.example:5432/shop?sslmode=require",
     "postgresql://app:***@db.example:5432/shop"),
    (f"postgresql+psycopg://app:{SECRET}@h/db",
     "postgresql+psycopg://app:***@h/db"),
    (f"postgres://h/db?password={SECRET}&application_name=x",
     "password=***&application_name=x"),
    (f"host=h port=5432 password={SECRET} dbname=shop",
     "host=h port=5432 password=*** dbname=shop"),
    (f"host=h password='{SECRET} x' dbname=shop",
     "password='***' dbname=shop"),
    (f"host=h sslpassword={SECRET}",
     "sslpassword=***"),
    (f"mysql+pymysql://root:{SECRET}@127.0.0.1:3306/shop",
     "mysql+pymysql://root:***@127.0.0.1:3306/shop"),
    (f"mariadb+mariadbconnector://u:{SECRET}@h/db",
     "mariadb+mariadbconnector://u:***@h/db"),
    (f"sqlite:////tmp/x.db?password={SECRET}",
     "sqlite:////tmp/x.db?password=***"),
    (f"iceberg://cat?type=rest&uri=https://c.example&credential=id:{SECRET}&table=t",
     "credential=***&table=t"),
    (f"iceberg://cat?s3.secret-access-key={SECRET}&s3.access-key-id=AKIA{SECRET}",
     "s3.secret-access-key=***&s3.access-key-id=***"),
    (f"iceberg://cat?token={SECRET}&key=id,ts",
     "token=***&key=id,ts"),
    (f"iceberg://cat?type=sql&uri=postgresql://u:{SECRET}@h/db&namespace=n",
     "uri=postgresql://u:***@h/db&namespace=n"),
    (f"iceberg://cat?type=sql&uri={quote(f'postgresql://u:{SECRET}@h/db', safe='')}",
     "iceberg://cat?type=sql&uri=postgresql%3A%2F%2Fu%3A***%40h%2Fdb"),
    (f"iceberg://cat?header.Authorization=Bearer%20{SECRET}",
     "header.Authorization=***"),
    (f"iceberg://cat?adls.account-key={SECRET}&gcs.oauth2.token={SECRET}",
     "adls.account-key=***&gcs.oauth2.token=***"),
    (f"s3://bucket/prefix?X-Amz-Credential=AK/{SECRET}&X-Amz-Signature={SECRET}",
     "s3://bucket/prefix?X-Amz-Credential=***&X-Amz-Signature=***"),
    (f"https://u:{SECRET}@receiver.example/in?api_key={SECRET}&v=2",
     "https://u:***@receiver.example/in?api_key=***&v=2"),
    (f"http://h/x?access_token={SECRET}",
     "access_token=***"),
    (f"delta:///data/t?aws_secret_access_key={SECRET}",
     "delta:///data/t?aws_secret_access_key=***"),
    (f"file:///data/t?sas={SECRET}",
     "file:///data/t?sas=***"),
    (f"kafka://app:{SECRET}@b1:9092,b2:9092/topic",
     "kafka://app:***@b1:9092,b2:9092/topic"),
    (f'SASL_SSL://b1:9093 sasl.jaas.config=org.PlainLoginModule required username="u" '
     f'password="{SECRET}";',
     'password="***"'),
    (f"sasl.password={SECRET} bootstrap.servers=b1:9092",
     "sasl.password=*** bootstrap.servers=b1:9092"),
    (f"weird+scheme://u:{SECRET}@h/p?my-api-token={SECRET}&pw={SECRET}&page=2",
     "weird+scheme://u:***@h/p?my-api-token=***&pw=***&page=2"),
    (f"x://u:p@ss{SECRET}@h/db",  # an unencoded '@' in the password
     "x://u:***@h/db"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "shown"), URIS)
def test_every_scheme_and_unknown_ones(text: str, shown: str) -> None:
    for made in (redact_uri(text), scrub(f"error: cannot use {text!r}: refused")):
        assert SECRET not in made, made
        assert shown in made, made


@pytest.mark.parametrize(
    "text",
    [
        f'{{"password": "{SECRET}", "user": "u"}}',
        f"{{'client_secret': '{SECRET}'}}",
        f"Connection(password={SECRET!r})",
        f'{{"error": "dsn host=h password={SECRET}"}}',
        f"Authorization: Bearer {SECRET}.x1",
        f"password: {SECRET}",
    ],
)
def test_json_repr_and_header_shapes(text: str) -> None:
    assert SECRET not in scrub(text), scrub(text)


def test_what_is_not_a_secret_stays() -> None:
    kept = [
        "table ns.t: key column 'id' is NULL in 3 rows",
        "pipelines.p.sinks.t.password_env: environment variable PGPW is not set",
        "iceberg://cat?type=rest&uri=https://c.example/api&key=id,ts&namespace=n",
        "postgresql://app@db:5432/shop",
        "a Basic authorization header was refused",
        "host=h port=5432 dbname=shop user=app",
        "s3://bucket/prefix/part-0001.parquet",
    ]
    for text in kept:
        assert scrub(text) == text


def test_secret_names() -> None:
    secret = ["password", "sslpassword", "client_secret", "refresh_token", "s3.session-token",
              "credential", "credentials", "api_key", "apikey", "s3.secret-access-key",
              "s3.access-key-id", "adls.account-key", "sslkey", "pwd", "pw", "auth",
              "header.Authorization", "sasl.jaas.config", "X-Amz-Signature", "sig",
              "sas"]  # fmt: skip
    plain = ["key", "keys", "table", "namespace", "uri", "host", "user", "password_env",
             "sslpassword_file", "oauth2-server-uri", "type", "mode", "bypass"]  # fmt: skip
    assert [n for n in secret if not is_secret_name(n)] == []
    assert [n for n in plain if is_secret_name(n)] == []


PASSWORD = "pa'ss\"w\\ord-é-42 +/="


def leaked(text: str) -> list[str]:
    raw = PASSWORD.encode()
    found = [PASSWORD, repr(PASSWORD)[1:-1], json.dumps(PASSWORD)[1:-1],
             json.dumps(PASSWORD, ensure_ascii=False)[1:-1], quote(PASSWORD, safe=""),
             base64.b64encode(raw).decode().rstrip("="),
             base64.urlsafe_b64encode(raw).decode().rstrip("=")]  # fmt: skip
    for prefix in (b"u:", b"us:", b"use:"):  # every alignment inside longer base64
        blob = base64.b64encode(prefix + raw + b"!").decode()
        found.append(blob[4:-4])
    return [form for form in found if form in text]


def test_a_known_secret_in_every_form() -> None:
    raw = PASSWORD.encode()
    texts = [
        f"the app said {PASSWORD}",
        repr({"note": PASSWORD}),
        repr([PASSWORD, "it's"]),
        json.dumps({"note": PASSWORD}),
        json.dumps({"note": PASSWORD}, ensure_ascii=False),
        f"url http://h/?q={quote(PASSWORD, safe='')}",
        "Basic " + base64.b64encode(b"user:" + raw).decode(),
        "token " + base64.urlsafe_b64encode(b"xy" + raw + b"zz").decode(),
        base64.b64encode(b"use:" + raw + b"!").decode(),
    ]
    for text in texts:
        assert leaked(text), text  # the forms the check looks for are really there
        made = redact(text, PASSWORD)
        assert leaked(made) == [], (text, made)
    assert forms("") == set() and redact("nothing", None, "") == "nothing"


def test_a_redactor_is_built_once_and_removes_the_longest_first() -> None:
    redactor = Redactor(["abc", "abcdef"])
    assert redactor("x abcdef y abc") == "x *** y ***"
    joined = redactor.with_secrets([PASSWORD])
    assert leaked(joined(repr(PASSWORD))) == [] and joined("abc") == "***"


def test_the_sql_sinks_url_and_the_config_connection(tmp_path: Path) -> None:
    from reconcile.cli.config import load_config
    from sinks.sql.errors import redact_url

    shown = redact_url(f"icebreg://cat?credential={SECRET}&type=rest")
    assert SECRET not in shown and "credential=***" in shown
    config = tmp_path / "c.toml"
    config.write_text(
        f"""
[store]
root = "store"

[pipelines.p.sinks.t]
url = "iceberg://cat?type=rest&credential={quote(PASSWORD, safe="")}"
table = "ns.t"
keys = ["id"]
"""
    )
    connection = load_config(config, env={}).pipeline("p").sinks[0].connection
    assert "credential=***" in repr(connection) and leaked(repr(connection)) == []
    # A secret-named parameter's value is one of the connection's secrets: it
    # is removed wherever a message shows it, in any form, not only by its name.
    said = f"the catalog refused {json.dumps(PASSWORD)} ({PASSWORD})"
    assert leaked(connection.redact(said)) == []


def test_an_iceberg_uri_error_and_repr_never_show_a_property_secret() -> None:
    from reconcile.core.contract import ConfigurationError
    from sinks.iceberg.location import parse_uri

    uri = f"iceberg://cat?type=rest&credential=id:{SECRET}&s3.secret-access-key={SECRET}"
    with pytest.raises(ConfigurationError) as err:
        parse_uri(uri + "&namespace=", default_table="t")
    assert SECRET not in str(err.value) and "credential=***" in str(err.value)
    location = parse_uri(uri, default_table="t")
    assert SECRET not in repr(location) and "cat" in repr(location)
    with pytest.raises(ConfigurationError) as loading:
        parse_uri(uri.replace("type=rest", "type=no-such-type"), default_table="t").load_catalog()
    assert SECRET not in str(loading.value), loading.value


def test_a_remembered_secret_is_gone_from_every_scrub_of_the_process() -> None:
    import logging
    import secrets

    from reconcile.core.logs import JsonFormatter
    from reconcile.core.redaction import remember

    # What a command does with its config file's secrets once it has loaded it.
    value = f"r{secrets.token_hex(6)}'\"\\"
    remember(value)
    said = f"a driver said {json.dumps(value)} and {base64.b64encode(value.encode()).decode()}"
    assert value not in scrub(said) and json.dumps(value)[1:-1] not in scrub(said)
    record = logging.LogRecord("app", logging.ERROR, __file__, 1, "%s", (repr(value),), None)
    line = JsonFormatter().format(record)
    assert repr(value)[1:-1] not in line and "***" in line, line
