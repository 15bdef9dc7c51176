"""Every row of MariaDB's type table (``MARIADB_TYPES``), on a real server with hostile defaults.

Parametrized over the table itself, as ``test_type_table_pg.py`` is: a row
added to ``MARIADB_TYPES`` is tested here, and fails until it has samples.
Each held type is written through a commit cycle with an expected state,
verified at 0 drift, damaged in one value by hand, found once, repaired to
what it was, and verified clean; the sink's ``arrow_schema()`` must hold it
as the row's ``store`` cell says. Each refused type is refused up front,
naming the table, the column and the type, with nothing written.

The server's global defaults are hostile while the module runs (a time zone of
``+05:30``; an ``sql_mode`` that pads CHAR values, takes ``"`` as a quote and
drops strict mode): the sink pins its own per session
(``sinks.sql.sessions``), so none of it is drift. The samples hold the values
the server would change without a word: trailing blanks in a CHAR and a
VARCHAR, a BINARY shorter than its width, a FLOAT whose text has 6 digits.
"""

from __future__ import annotations

import datetime as dt
import itertools
import re
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from reconcile import CommitCycle, CommitSucceeded
from reconcile.core.results import CommitFatal
from reconcile.engine.expected import ExpectedState
from reconcile.recovery import recover
from sinks.sql.mariadb_types import MARIADB_TYPES, SqlType
from sinks.sql.sink import SqlSink
from tests.mariadb_server import MariadbServer
from tests.type_samples import Refused, Sample, type_params

pytestmark = pytest.mark.integration

HOSTILE = "SET GLOBAL time_zone = '+05:30', GLOBAL sql_mode = 'ANSI_QUOTES,PAD_CHAR_TO_FULL_LENGTH'"
RESTORE = "SET GLOBAL time_zone = 'SYSTEM', GLOBAL sql_mode = DEFAULT"

_DT = dt.datetime(2024, 3, 5, 1, 2, 3, 456789)

# Keyed by the row's ``sql`` (its first cell in docs/types.md).
SAMPLES: dict[str, list[Sample | Refused]] = {
    "BOOLEAN (TINYINT(1))": [Sample("BOOLEAN", (True, False, None), False)],
    "TINYINT": [
        Sample("TINYINT", (127, -128, 0), 1),
        Sample("TINYINT UNSIGNED", (255, 0, 1), 2),
    ],
    "SMALLINT": [
        Sample("SMALLINT", (32767, -32768, 0), 1),
        Sample("SMALLINT UNSIGNED", (65535, 0, 1), 65534),
    ],
    "MEDIUMINT": [Sample("MEDIUMINT UNSIGNED", (16777215, 0, 1), 2)],
    "INT": [
        Sample("INT", (2**31 - 1, -(2**31), 0), 1),
        Sample("INT UNSIGNED", (2**32 - 1, 0, 1), 2**32 - 2),
    ],
    "BIGINT": [
        Sample("BIGINT", (2**63 - 1, -(2**63), 2**53 + 1), 2**53),
        Sample("BIGINT UNSIGNED", (2**63 - 1, 0, 1), 2**63 - 2),
    ],
    "DECIMAL(p, s), p ≤ 38": [
        Sample("DECIMAL(12,3)", (Decimal("1.500"), Decimal("-999999999.999"), 0), Decimal("1.501")),
        Sample("DECIMAL(38,0)", (10**37, -(10**38 - 1), 7), 10**37 + 1),
    ],
    "FLOAT": [Sample("FLOAT", (0.123456789, 3.0e38, -0.0), 0.1234568)],
    "DOUBLE, REAL": [Sample("DOUBLE", (0.1, 1e308, -0.0), 0.10000000000000002)],
    "CHAR(n)": [Sample("CHAR(4)", ("ab ", "abcd", ""), "ac")],
    "VARCHAR(n)": [Sample("VARCHAR(4)", ("ab  ", "x", ""), "ab")],
    "TINYTEXT, TEXT, MEDIUMTEXT, LONGTEXT, JSON, ENUM": [
        Sample("TEXT", ("ünï\t\\", "", "x" * 1000), "y"),
        Sample("JSON", ('{"b": 1,  "a": [1, 2.50]}', "[1,2]", "null"), '{"b": 1, "a": [1, 2.5]}'),
        Sample("ENUM('a','b','c')", ("a", "b", None), "c"),
    ],
    "UUID": [
        Sample(
            "UUID",
            (
                "0E4F1C2A-9B3D-4C5E-8F60-7A8B9C0D1E2F",
                "AABBCCDDEEFF40118233445566778899",
                None,
            ),
            "0e4f1c2a-9b3d-4c5e-8f60-7a8b9c0d1e20",
        )
    ],
    "BINARY(n)": [Sample("BINARY(4)", (b"ab", b"\x00\xff\x00\x01", b""), b"ab\x00\x01")],
    "VARBINARY(n), TINYBLOB, BLOB, MEDIUMBLOB, LONGBLOB": [
        Sample("VARBINARY(8)", (b"ab \x00", b"", b"\xff"), b"ab "),
        Sample("BLOB", (b"\x00\xff", b"", b"ab "), b"ab"),
    ],
    "DATE": [
        Sample(
            "DATE",
            (dt.date(2024, 3, 5), dt.date(1000, 1, 1), dt.date(9999, 12, 31)),
            dt.date(2024, 5, 3),
        )
    ],
    "DATETIME(p), TIMESTAMP(p)": [
        Sample(
            "DATETIME(6)",
            (_DT, dt.datetime(1000, 1, 1), dt.datetime(9999, 12, 31, 23, 59, 59, 999999)),
            _DT + dt.timedelta(microseconds=1),
        ),
        Sample("DATETIME", (_DT.replace(microsecond=0), None, None), _DT.replace(second=4)),
        Sample(
            "TIMESTAMP(6) NULL",
            (_DT, dt.datetime(1970, 1, 2), dt.datetime(2038, 1, 1)),
            _DT + dt.timedelta(microseconds=1),
        ),
        Sample(
            "TIMESTAMP(3) NULL",
            (_DT.replace(microsecond=456000), None, None),
            _DT.replace(microsecond=457000),
        ),
    ],
    "DECIMAL(p, s), p > 38": [Refused("DECIMAL(65,30)", Decimal("1.5"))],
    "FLOAT(M,D), DOUBLE(M,D)": [Refused("FLOAT(10,2)", 0.5), Refused("DOUBLE(12,3)", 0.5)],
    "SET": [Refused("SET('a','b')", "a,b")],
    "TIME": [Refused("TIME", dt.time(1, 2))],
    "YEAR": [Refused("YEAR", 2024)],
    "BIT(n)": [Refused("BIT(8)", 1)],
    "INET4, INET6, GEOMETRY and every other type": [Refused("INET6", "::1")],
}

# The default tier's share: one of each way a type is held and one refused.
DEFAULT_TIER = {"INT UNSIGNED", "DECIMAL(12,3)", "FLOAT", "CHAR(4)", "VARCHAR(4)", "BINARY(4)",
                "DATETIME(6)", "DATETIME", "UUID", "SET('a','b')"}  # fmt: skip


_counter = itertools.count()


@pytest.fixture(scope="module")
def hostile_db(mariadb_server: MariadbServer) -> Iterator[tuple[MariadbServer, str]]:
    """A database on a server whose global defaults are hostile while the module runs."""
    name = mariadb_server.create_database("types")
    with mariadb_server.connect() as conn, conn.cursor() as cur:
        cur.execute(HOSTILE)
    try:
        with mariadb_server.connect(name) as conn, conn.cursor() as cur:
            cur.execute("SELECT @@session.time_zone, @@session.sql_mode")
            assert cur.fetchone() == ("+05:30", "ANSI_QUOTES,PAD_CHAR_TO_FULL_LENGTH")
        yield mariadb_server, name
    finally:
        with mariadb_server.connect() as conn, conn.cursor() as cur:
            cur.execute(RESTORE)
        mariadb_server.drop_database(name)


def _sql(db: tuple[MariadbServer, str], query: str, *params: Any) -> list[tuple[Any, ...]]:
    server, name = db
    with server.connect(name) as conn, conn.cursor() as cur:
        cur.execute(query, params or None)
        return [tuple(r) for r in cur.fetchall()]


def _write(db: tuple[MariadbServer, str], root: Path, table: str, rows: list[Any]) -> Any:
    server, name = db
    expected = ExpectedState(str(root), "shop", {table: ["k"]})
    cycle = CommitCycle("shop", [SqlSink(server.url(name), table, name=table)],
                        expected_state=expected)  # fmt: skip
    cycle.start()
    try:
        return cycle.run_epoch(0, {table: rows})
    finally:
        cycle.close()


def _recover(
    db: tuple[MariadbServer, str], root: Path, table: str, *, dry_run: bool
) -> tuple[int, int, int]:
    server, name = db
    report = recover(server.url(name), str(root), "shop", table, mode="full", dry_run=dry_run,
                     allow_mass_change=True)  # fmt: skip
    return report.missing, report.extra, report.changed


def _column_type(db: tuple[MariadbServer, str], table: str) -> str:
    return str(_sql(db, "SELECT COLUMN_TYPE FROM information_schema.COLUMNS WHERE "
                        "TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s AND COLUMN_NAME = 'v'",
                    table)[0][0])  # fmt: skip


@pytest.mark.parametrize(
    ("entry", "sample"), list(type_params(MARIADB_TYPES, SAMPLES, DEFAULT_TIER))
)
def test_each_row_of_the_type_table(
    hostile_db: tuple[MariadbServer, str],
    tmp_path: Path,
    entry: SqlType,
    sample: Sample | Refused | None,
) -> None:
    assert sample is not None, f"no samples for the type table's row {entry.doc.sql!r}: add some"
    assert isinstance(sample, Sample) == (not entry.doc.refused), (entry.doc.sql, sample)
    table = f"t{next(_counter)}"
    _sql(hostile_db, f"CREATE TABLE {table} (k INT PRIMARY KEY, v {sample.ddl}, _epoch BIGINT)")
    server, name = hostile_db
    sink = SqlSink(server.url(name), table, name=table)
    schema = sink.arrow_schema()
    sink.close()
    if isinstance(sample, Refused):
        result = _write(hostile_db, tmp_path, table, [{"k": 1, "v": sample.value}])
        assert isinstance(result, CommitFatal), result
        assert entry.doc.refused in result.reason, result.reason
        spelled = sample.ddl.split("(")[0].upper()
        for part in (repr(table), "column 'v' is ", spelled if spelled != "INET6" else "not know"):
            assert part in result.reason, (part, result.reason)
        assert _sql(hostile_db, f"SELECT count(*) FROM {table}") == [(0,)]
        return
    # The code holds the column as the row says (its store cell names the Arrow type).
    held = re.sub(r"decimal128\(\d+, \d+\)", "decimal128(p, s)", str(schema.field("v").type))
    assert held.replace("[day]", "") in entry.doc.store, (schema.field("v"), entry.doc.store)
    rows = [{"k": k, "v": v} for k, v in enumerate(sample.values, start=1)]
    result = _write(hostile_db, tmp_path, table, rows)
    assert isinstance(result, CommitSucceeded), result
    # A FLOAT's own text has 6 digits: read as a double, its value is all there.
    value = "v + 0e0" if sample.ddl == "FLOAT" else "v"
    query = f"SELECT k, {value} FROM {table} ORDER BY k"
    written = _sql(hostile_db, query)
    assert [r[0] for r in written] == [1, 2, 3], written
    assert _recover(hostile_db, tmp_path, table, dry_run=True) == (0, 0, 0)
    # One value changed by hand to another valid value of the type.
    _sql(hostile_db, f"UPDATE {table} SET v = %s WHERE k = 1", sample.damage)
    assert _sql(hostile_db, query) != written, "the damage changed nothing"
    assert _recover(hostile_db, tmp_path, table, dry_run=True) == (0, 0, 1)
    assert _recover(hostile_db, tmp_path, table, dry_run=False) == (0, 0, 1)
    assert _sql(hostile_db, query) == written
    assert _recover(hostile_db, tmp_path, table, dry_run=True) == (0, 0, 0)
    assert _column_type(hostile_db, table)  # the table is still the one created


@pytest.mark.parametrize("ddl", ["DATETIME", "TIMESTAMP NULL", "DATETIME(3)"])
def test_a_datetime_key_finer_than_its_column_is_refused_not_merged(
    hostile_db: tuple[MariadbServer, str], tmp_path: Path, ddl: str
) -> None:
    # The server would drop the microseconds: two keys written as one row.
    table = f"t{next(_counter)}"
    _sql(hostile_db, f"CREATE TABLE {table} (k {ddl} PRIMARY KEY, v INT, _epoch BIGINT)")
    rows = [{"k": _DT.replace(microsecond=0), "v": 1}, {"k": _DT, "v": 2}]
    result = _write(hostile_db, tmp_path, table, rows)
    assert isinstance(result, CommitFatal), result
    for part in (f"'{table}'", "column 'k'", "fractional digits", ddl.split()[0]):
        assert part in result.reason, (part, result.reason)
    assert _sql(hostile_db, f"SELECT count(*) FROM {table}") == [(0,)]


def test_a_datetime6_key_keeps_keys_a_microsecond_apart(
    hostile_db: tuple[MariadbServer, str], tmp_path: Path
) -> None:
    table = f"t{next(_counter)}"
    _sql(hostile_db, f"CREATE TABLE {table} (k DATETIME(6) PRIMARY KEY, v INT, _epoch BIGINT)")
    rows = [{"k": _DT, "v": 1}, {"k": _DT + dt.timedelta(microseconds=1), "v": 2}]
    assert isinstance(_write(hostile_db, tmp_path, table, rows), CommitSucceeded)
    assert _sql(hostile_db, f"SELECT k, v FROM {table} ORDER BY k") == [
        (_DT, 1),
        (_DT + dt.timedelta(microseconds=1), 2),
    ]
    assert _recover(hostile_db, tmp_path, table, dry_run=True) == (0, 0, 0)
