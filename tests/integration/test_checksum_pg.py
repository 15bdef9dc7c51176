"""The bucket checksum against a real PostgreSQL: pinned vectors, and random rows of every kind.

The same row must give the same checksum in the database (``row_checksum_sql``,
computed from the values it holds) and here (``row_checksums``, from the
expected state's Arrow rows), or buckets mode would see drift that is not there
or miss drift that is.
"""

from __future__ import annotations

import datetime as dt
import math
import uuid
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql

from reconcile.core.checksum import SEED, row_checksums
from reconcile.core.value_forms import ValueForm
from sinks.postgres.checksum_sql import row_checksum_sql, row_text_sql, server_check_sql
from tests.unit.test_checksum import FIELD_VECTORS, HASH_VECTORS

pytestmark = pytest.mark.integration

COLUMNS = [
    ("k", "int", "bigint", pa.int64()),
    ("i", "int", "integer", pa.int32()),
    ("b", "bool", "boolean", pa.bool_()),
    ("n", "numeric", "numeric(20,4)", pa.decimal128(20, 4)),
    ("d", "float8", "float8", pa.float64()),
    ("f", "float4", "float4", pa.float32()),
    ("dd", "date", "date", pa.date32()),
    ("ts", "timestamp", "timestamp", pa.timestamp("us")),
    ("tz", "timestamptz", "timestamptz", pa.timestamp("us", tz="UTC")),
    ("t", "text", "text", pa.string()),
    ("u", "uuid", "uuid", pa.string()),
    ("by", "bytes", "bytea", pa.binary()),
]
SCHEMA = pa.schema([(name, typ) for name, _, _, typ in COLUMNS])
KINDS = [(name, kind) for name, kind, _, _ in COLUMNS]


@pytest.fixture(scope="module")
def conn(pg_server: Any) -> Any:
    name = pg_server.create_database("ck")
    with psycopg.connect(pg_server.dsn(name), autocommit=True) as c:
        c.execute("CREATE TABLE ck (" + ", ".join(f"{n} {t}" for n, _, t, _ in COLUMNS) + ")")
        yield c
    pg_server.drop_database(name)


def test_the_pinned_vectors_and_the_server_check(conn: Any) -> None:
    seed = SEED - (1 << 64) if SEED >= 1 << 63 else SEED
    for text, want in HASH_VECTORS:
        got = conn.execute('SELECT hashtextextended(%s COLLATE "C", %s)', (text, seed))
        assert got.fetchone() == (want,), text
    query, values = server_check_sql()
    assert list(conn.execute(query).fetchone()) == [v for _, v in values]


@pytest.mark.parametrize(("kind", "typ", "value", "text"), FIELD_VECTORS)
def test_field_texts_are_the_servers(conn: Any, kind: str, typ: pa.DataType, value: Any,
                                     text: str) -> None:  # fmt: skip
    pg_type = {"int": "bigint", "bool": "boolean", "numeric": "numeric", "float8": "float8",
               "float4": "float4", "date": "date", "timestamp": "timestamp",
               "timestamptz": "timestamptz", "text": "text", "uuid": "uuid",
               "bytes": "bytea"}[kind]  # fmt: skip
    if isinstance(value, bytes) and kind == "uuid":
        value = uuid.UUID(bytes=value)
    query = sql.SQL("SELECT {} FROM (SELECT %s::{} AS v) AS s").format(
        row_text_sql([("v", kind)], alias="s"), sql.SQL(pg_type)
    )
    if kind in ("float8", "float4") and isinstance(value, float) and math.isnan(value):
        value = "NaN"
    elif kind in ("float8", "float4") and isinstance(value, float) and math.isinf(value):
        value = "-Infinity"
    assert conn.execute(query, (value,)).fetchone() == (text,)


values = st.fixed_dictionaries(
    {
        "k": st.integers(-(2**63), 2**63 - 1),
        "i": st.none() | st.integers(-(2**31), 2**31 - 1),
        "b": st.none() | st.booleans(),
        "n": st.none()
        | st.decimals(min_value=-(10**15), max_value=10**15, places=4, allow_nan=False),
        "d": st.none() | st.floats(allow_nan=True, allow_infinity=True),
        "f": st.none() | st.floats(width=32, allow_nan=False, allow_infinity=True),
        "dd": st.none() | st.dates(dt.date(1, 1, 1), dt.date(9999, 12, 31)),
        "ts": st.none() | st.datetimes(dt.datetime(1, 1, 1), dt.datetime(9999, 12, 31)),
        "tz": st.none()
        | st.datetimes(dt.datetime(1, 1, 2), dt.datetime(9999, 12, 30), timezones=st.just(dt.UTC)),
        "t": st.none()
        | st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00")),
        "u": st.none() | st.uuids().map(str),
        "by": st.none() | st.binary(max_size=40),
    }
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(rows=st.lists(values, min_size=1, max_size=12))
def test_random_rows_checksum_alike_in_postgres_and_python(
    conn: Any, rows: list[dict[str, Any]]
) -> None:
    conn.execute("TRUNCATE ck")
    names = [n for n, _, _, _ in COLUMNS]
    with conn.cursor() as cur:
        cur.executemany(
            sql.SQL("INSERT INTO ck ({}) VALUES ({})").format(
                sql.SQL(", ").join(map(sql.Identifier, names)),
                sql.SQL(", ").join(sql.Placeholder() * len(names)),
            ),
            [[r[n] for n in names] for r in rows],
        )
    got = conn.execute(sql.SQL("SELECT k, {} FROM ck").format(row_checksum_sql(KINDS))).fetchall()
    table = pa.Table.from_pylist(rows, schema=SCHEMA)
    mine = [v - (1 << 64) if v >= 1 << 63 else v for v in map(int, row_checksums(table, KINDS))]
    assert sorted(got) == sorted(zip(table.column("k").to_pylist(), mine, strict=True))


def test_char_json_and_jsonb_checksum_as_their_forms(conn: Any) -> None:
    """What the server holds, respelled or padded, checksums as the store's form of it."""
    conn.execute("CREATE TABLE ck_forms (k bigint, c char(4), j json, jb jsonb)")
    given = [
        (1, "ab", '{"b": [1, 2.50],  "a": 1}', '{"z": {"y": null}, "a": true}'),
        (2, "abcd", '"text"', "[1e2, -0.0]"),
        (3, None, None, None),
    ]
    conn.cursor().executemany("INSERT INTO ck_forms VALUES (%s, %s, %s, %s)", given)
    kinds = [("c", "char"), ("j", "jsonb"), ("jb", "jsonb")]
    got = conn.execute(
        sql.SQL("SELECT k, {} FROM ck_forms").format(row_checksum_sql(kinds))
    ).fetchall()
    forms = {"c": ValueForm("bpchar", 4), "j": ValueForm("jsonb"), "jb": ValueForm("jsonb")}
    table = pa.table({
        "k": pa.array([r[0] for r in given], pa.int64()),
        **{name: forms[name].of_arrow(pa.array([r[i + 1] for r in given], pa.string()))
           for i, name in enumerate(("c", "j", "jb"))},
    })  # fmt: skip
    assert table.column("c").to_pylist() == ["ab  ", "abcd", None]
    mine = [v - (1 << 64) if v >= 1 << 63 else v for v in map(int, row_checksums(table, kinds))]
    assert sorted(got) == sorted(zip(table.column("k").to_pylist(), mine, strict=True))
