"""Every row of PostgreSQL's type table (``PG_TYPES``), on a real server with hostile defaults.

The test is parametrized over the table itself: a row added to ``PG_TYPES``
is tested here, and fails until it has samples below. For each column type
it holds, a table of a key and a column of that type is written through a
commit cycle with an expected state; verify finds 0 drift; one value changed
by hand (to another valid value of the type) is found exactly once, repaired
to what it was, and the next verify is clean. For each type it refuses, a
write is refused up front naming the table, the column and the type, and
nothing is written.

The database's defaults are hostile (a DST zone west of UTC, DateStyle ``SQL,
DMY``, ``sql_standard`` intervals, rounded floats, escaped bytea): the
engine's sessions pin their own, so none of it is drift. The damage is
chosen where those settings would hide or fake it: a date with its day and
month swapped, a float one ulp away (which ``extra_float_digits = 0`` prints
the same), a timestamp one microsecond off.
"""

from __future__ import annotations

import datetime as dt
import itertools
import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from reconcile import CommitCycle, CommitSucceeded
from reconcile.core.results import CommitFatal
from reconcile.engine.expected import ExpectedState
from reconcile.recovery import recover
from sinks.postgres.arrow_types import PG_TYPES, PgType
from sinks.postgres.factory import postgres_sink
from tests.fix_pg import PgServer
from tests.type_samples import Refused, Sample, type_params

pytestmark = pytest.mark.integration

HOSTILE = {
    "TimeZone": "America/Sao_Paulo",
    "DateStyle": "SQL, DMY",
    "IntervalStyle": "sql_standard",
    "extra_float_digits": "0",
    "bytea_output": "escape",
}

SP = dt.timezone(dt.timedelta(hours=-3))
KOLKATA = dt.timezone(dt.timedelta(hours=5, minutes=30))


U = [uuid.UUID(int=n * 0x1111_1111_1111_1111) for n in (1, 2, 3, 4)]

# Keyed by the row's ``sql`` (its first cell in docs/types.md).
SAMPLES: dict[str, list[Sample | Refused]] = {
    "smallint": [Sample("smallint", (1, -32768, 32767), 2)],
    "integer": [Sample("integer", (0, -(2**31), 2**31 - 1), 1)],
    "bigint": [Sample("bigint", (2**53 + 1, -(2**63), 2**63 - 1), 2**53)],
    "numeric(p, s), p ≤ 38, 0 ≤ s ≤ p; numeric": [
        Sample("numeric(12,3)", (Decimal("1.500"), Decimal("-999999999.999"), 0), Decimal("1.501")),
        Sample(
            "numeric",
            (Decimal("1.5"), Decimal("-0.000000000000000001"), 10**19),
            Decimal("1.500000000000000001"),
        ),
        Sample("numeric(38,0)", (10**37, -(10**38 - 1), 7), 10**37 + 1),
    ],
    "real": [Sample("real", (0.1, float("inf"), float("nan")), 0.10000001)],
    "double precision": [
        Sample("double precision", (0.1, -float("inf"), 1e308), 0.10000000000000002)
    ],
    "boolean": [Sample("boolean", (True, False, None), False)],
    "text": [Sample("text", ("a", "ünï\tcode\\", ""), "b")],
    "varchar(n), varchar": [
        Sample("varchar(5)", ("abc", "abcde", ""), "abd"),
        Sample("varchar", ("abc", "x" * 300, " "), "abc "),
    ],
    "char(n), character(n), bpchar": [
        Sample("char(4)", ("ab", "abcd", " "), "ac"),
        Sample("bpchar", ("ab", "abc", "x"), "abd"),
    ],
    "citext": [Sample("citext", ("Abc", "x", "ÉTÉ"), "ABC")],
    "uuid": [Sample("uuid", (U[0], str(U[1]).upper(), "{" + str(U[2]) + "}"), U[3])],
    "date": [
        Sample(
            "date",
            (dt.date(2024, 3, 5), dt.date(1, 1, 1), dt.date(9999, 12, 31)),
            dt.date(2024, 5, 3),
        )
    ],
    "timestamp(p), timestamp": [
        Sample(
            "timestamp",
            (
                dt.datetime(2024, 3, 5, 1, 2, 3, 456789),
                dt.datetime(1900, 1, 1),
                dt.datetime(2024, 10, 6, 0, 30),
            ),
            dt.datetime(2024, 3, 5, 1, 2, 3, 456790),
        ),
        Sample(
            "timestamp(3)",
            (dt.datetime(2024, 3, 5, 1, 2, 3, 456000), dt.datetime(1999, 12, 31, 23, 59, 59), None),
            dt.datetime(2024, 3, 5, 1, 2, 3, 457000),
        ),
    ],
    "timestamptz(p), timestamptz": [
        Sample(
            "timestamptz",
            (
                dt.datetime(2024, 3, 5, 1, 2, 3, 456789, tzinfo=SP),
                dt.datetime(2024, 11, 3, 0, 30, tzinfo=dt.UTC),
                dt.datetime(1950, 6, 1, 12, tzinfo=KOLKATA),
            ),
            dt.datetime(2024, 3, 5, 4, 2, 3, 456790, tzinfo=dt.UTC),
        ),
        Sample(
            "timestamptz(0)",
            (
                dt.datetime(2024, 3, 5, 1, 2, 3, tzinfo=SP),
                dt.datetime(2024, 2, 29, tzinfo=KOLKATA),
                None,
            ),
            dt.datetime(2024, 3, 5, 4, 2, 4, tzinfo=dt.UTC),
        ),
    ],
    "bytea": [Sample("bytea", (b"\x00\xff\\", b"", b"\\x41"), b"\x00\xfe\\")],
    "json": [Sample("json", ('{"b": 1, "a": [1, 2.50]}', [1, "two"], '"s"'), '{"a": [1, 2.5]}')],
    "jsonb": [Sample("jsonb", ({"b": 1, "a": None}, "3", "null"), '{"b": 1, "a": 0}')],
    # The refused ones: a write is refused before anything is written.
    "time, timetz": [Refused("time", dt.time(1, 2)), Refused("timetz", "01:02+05:30")],
    "interval": [Refused("interval", dt.timedelta(days=1))],
    "name": [Refused("name", "n")],
    "money": [Refused("money", Decimal("1.50"))],
    "numeric(p, s), p > 38 or s < 0 or s > p": [Refused("numeric(40,2)", Decimal("1.5"))],
    "arrays, enums, domains, composite and range types, xml, inet, cidr, macaddr, bit, "
    "geometric and every other type": [
        Refused("int4[]", [1]),
        Refused("inet", "10.0.0.1"),
        Refused("xml", "<a/>"),
    ],
}


# The default tier's share (about a second each): one of each way a type is held (an
# integer, a decimal, a float, padded text, a form, a date, a zone, bytes, json) and one
# refused; the slow tier runs every row.
DEFAULT_TIER = {"smallint", "numeric(12,3)", "double precision", "char(4)", "uuid", "date",
                "timestamptz", "bytea", "jsonb", "interval"}  # fmt: skip


_counter = itertools.count()


@pytest.fixture(scope="module")
def hostile_db(pg_server: PgServer) -> Iterator[str]:
    """One database for the module, whose defaults are the hostile settings above."""
    name = pg_server.database_with_defaults("types_hostile", HOSTILE)
    dsn = pg_server.dsn(name)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION citext")
    yield dsn
    pg_server.drop_database(name)


def _sql(dsn: str, query: sql.SQL | sql.Composed | str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(query, params or None)
        return cur.fetchall() if cur.description else []


def _write(dsn: str, root: Path, table: str, rows: list[dict[str, Any]]) -> Any:
    expected = ExpectedState(str(root), "shop", {table: ["k"]})
    cycle = CommitCycle("shop", [postgres_sink(dsn, table, name=table)], expected_state=expected)
    cycle.start()
    try:
        return cycle.run_epoch(0, {table: rows})
    finally:
        cycle.close()


def _recover(dsn: str, root: Path, table: str, *, dry_run: bool) -> tuple[int, int, int]:
    report = recover(
        dsn, str(root), "shop", table, mode="full", dry_run=dry_run, allow_mass_change=True
    )
    return report.missing, report.extra, report.changed


def _snapshot(dsn: str, table: str) -> list[tuple[Any, ...]]:
    # Each value as the server sends it in binary, which no session setting changes (a
    # numeric by value: an unbounded numeric repaired comes back at the store's scale).
    query = sql.SQL("SELECT k, v FROM {} ORDER BY k").format(sql.Identifier(table))
    with psycopg.connect(dsn, autocommit=True) as conn, conn.cursor(binary=True) as cur:
        return [tuple(_same(v) for v in row) for row in cur.execute(query).fetchall()]


def _same(value: Any) -> Any:
    # NaN is not equal to itself; its text is.
    return "NaN" if isinstance(value, float) and value != value else value


@pytest.mark.parametrize(("entry", "sample"), list(type_params(PG_TYPES, SAMPLES, DEFAULT_TIER)))
def test_each_row_of_the_type_table(
    hostile_db: str, tmp_path: Path, entry: PgType, sample: Sample | Refused | None
) -> None:
    assert sample is not None, f"no samples for the type table's row {entry.doc.sql!r}: add some"
    held = entry.store is not None
    assert isinstance(sample, Sample) == held, (entry.doc.sql, sample)
    table = f"t{next(_counter)}"
    ident = sql.Identifier(table)
    _sql(hostile_db, sql.SQL("CREATE TABLE {} (k integer PRIMARY KEY, v {}, _epoch bigint)")
         .format(ident, sql.SQL(sample.ddl)))  # fmt: skip
    if isinstance(sample, Refused):
        result = _write(hostile_db, tmp_path, table, [{"k": 1, "v": sample.value}])
        assert isinstance(result, CommitFatal), result
        spelled = _sql(hostile_db, "SELECT format_type(atttypid, atttypmod) FROM pg_attribute "
                       "WHERE attrelid = %s::regclass AND attname = 'v'", table)[0][0]  # fmt: skip
        for part in (repr(table), f"column 'v' is {spelled} (", entry.doc.refused):
            assert part in result.reason, (part, result.reason)
        assert _sql(hostile_db, sql.SQL("SELECT count(*) FROM {}").format(ident)) == [(0,)]
        return
    rows = [{"k": k, "v": v} for k, v in enumerate(sample.values, start=1)]
    result = _write(hostile_db, tmp_path, table, rows)
    assert isinstance(result, CommitSucceeded), result
    written = _snapshot(hostile_db, table)
    assert [k for k, _ in written] == [1, 2, 3]
    assert _recover(hostile_db, tmp_path, table, dry_run=True) == (0, 0, 0)
    # One value changed by hand to another valid value of the type.
    _sql(hostile_db, sql.SQL("UPDATE {} SET v = %s WHERE k = 1").format(ident), sample.damage)
    assert _snapshot(hostile_db, table) != written, "the damage changed nothing"
    assert _recover(hostile_db, tmp_path, table, dry_run=True) == (0, 0, 1)
    assert _recover(hostile_db, tmp_path, table, dry_run=False) == (0, 0, 1)
    assert _snapshot(hostile_db, table) == written
    assert _recover(hostile_db, tmp_path, table, dry_run=True) == (0, 0, 0)
