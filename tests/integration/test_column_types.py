"""jsonb/json, uuid and char(n) columns on real PostgreSQL: written, verified and repaired.

Each type takes a value in several spellings and gives back one (its value
form, ``reconcile.core.value_forms``). The rows are written by a commit cycle
with an expected state, read back with SQL (``jsonb_typeof``, the uuid's text,
the char's padding), and verify must find no drift; a value changed by hand is
found and repaired, and the next verify is clean.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pytest

from reconcile import CommitCycle, CommitSucceeded
from reconcile.core.contract import Change
from reconcile.core.results import CommitFatal
from reconcile.engine.expected import ExpectedState
from reconcile.recovery import recover
from sinks.postgres.factory import postgres_sink

pytestmark = pytest.mark.integration

DDL = (
    "CREATE TABLE docs (id uuid PRIMARY KEY, code char(4) NOT NULL, doc jsonb, raw json, "
    "tag char(3), _epoch bigint)"
)
CHAR_KEY_DDL = "CREATE TABLE codes (code char(5) PRIMARY KEY, n integer, _epoch bigint)"
U1 = uuid.UUID("0e4f1c2a-9b3d-4c5e-8f60-7a8b9c0d1e2f")
U2 = uuid.UUID("aabbccdd-eeff-4011-8233-445566778899")
U3 = uuid.UUID("12345678-1234-5678-9abc-def012345678")


def _sql(dsn: str, query: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(query, params or None)
        return cur.fetchall() if cur.description else []


def _cycle(dsn: str, root: Path, table: str, keys: list[str]) -> CommitCycle:
    expected = ExpectedState(str(root), "shop", {table: keys})
    cycle = CommitCycle("shop", [postgres_sink(dsn, table, name=table)], expected_state=expected)
    cycle.start()
    return cycle


def _run(dsn: str, root: Path, table: str, keys: list[str], epochs: list[Any]) -> list[Any]:
    cycle = _cycle(dsn, root, table, keys)
    try:
        return [cycle.run_epoch(i, {table: rows}) for i, rows in enumerate(epochs)]
    finally:
        cycle.close()


def _verify(dsn: str, root: Path, table: str, **options: Any) -> tuple[int, int, int]:
    report = recover(dsn, str(root), "shop", table, mode="full", dry_run=True, **options)
    return report.missing, report.extra, report.changed


@pytest.fixture
def dsn(pg_db: str) -> str:
    _sql(pg_db, DDL)
    _sql(pg_db, CHAR_KEY_DDL)
    return pg_db


def test_json_text_lands_as_the_document_and_verify_finds_no_drift(
    dsn: str, tmp_path: Path
) -> None:
    rows = [
        {
            "id": U1,
            "code": "ab",
            "doc": '{"b": [1, 2.50], "a": 1}',
            "raw": '{"z":  1, "a": 2}',
            "tag": "x",
        },
        {
            "id": str(U2).upper(),
            "code": "abcd",
            "doc": {"k": {"n": None}, "aa": True},
            "raw": [1, "two"],
            "tag": None,
        },
        {
            "id": "{" + str(U3) + "}",
            "code": "c  ",
            "doc": '"just a string"',
            "raw": "3",
            "tag": "yz ",
        },
    ]
    results = _run(dsn, tmp_path, "docs", ["id"], [rows])
    assert all(isinstance(r, CommitSucceeded) for r in results), results
    got = _sql(
        dsn,
        "SELECT id::text, jsonb_typeof(doc), doc::text, json_typeof(raw), raw::text, "
        "code, octet_length(code), tag FROM docs ORDER BY id",
    )
    assert got == [
        (
            str(U1),
            "object",
            '{"a": 1, "b": [1, 2.50]}',
            "object",
            '{"a": 2, "z": 1}',
            "ab  ",
            4,
            "x  ",
        ),
        (str(U3), "string", '"just a string"', "number", "3", "c   ", 4, "yz "),
        (
            str(U2),
            "object",
            '{"k": {"n": null}, "aa": true}',
            "array",
            '[1, "two"]',
            "abcd",
            4,
            None,
        ),
    ]
    assert _verify(dsn, tmp_path, "docs") == (0, 0, 0)


def _repair(dsn: str, root: Path, table: str) -> tuple[int, int, int]:
    report = recover(dsn, str(root), "shop", table, mode="full", allow_mass_change=True)
    return report.missing, report.extra, report.changed


def test_json_is_compared_by_meaning_and_repaired(dsn: str, tmp_path: Path) -> None:
    row = {"id": U1, "code": "ab", "doc": {"a": 1, "b": [1, 2]}, "raw": '{"x": 1}', "tag": "x"}
    assert isinstance(_run(dsn, tmp_path, "docs", ["id"], [[row]])[0], CommitSucceeded)
    # The same documents spelled otherwise by hand: no drift, in full and buckets mode
    # (whose checksums take the char(n) columns too, padded).
    _sql(dsn, """UPDATE docs SET doc = '{"b":[1,2],  "a":1}', raw = '{ "x" : 1 }'""")
    assert _verify(dsn, tmp_path, "docs") == (0, 0, 0)
    buckets = recover(dsn, str(tmp_path), "shop", "docs", mode="buckets", dry_run=True)
    assert (buckets.missing, buckets.extra, buckets.changed) == (0, 0, 0)
    # Other documents: drift, repaired to the expected ones, then none.
    _sql(dsn, """UPDATE docs SET doc = '"{\\"a\\": 1}"', raw = '{"x": 2}'""")
    assert _sql(dsn, "SELECT jsonb_typeof(doc) FROM docs") == [("string",)]
    assert _verify(dsn, tmp_path, "docs") == (0, 0, 1)
    assert _repair(dsn, tmp_path, "docs") == (0, 0, 1)
    assert _sql(dsn, "SELECT jsonb_typeof(doc), doc::text, raw::jsonb::text FROM docs") == [
        ("object", '{"a": 1, "b": [1, 2]}', '{"x": 1}')
    ]
    assert _verify(dsn, tmp_path, "docs") == (0, 0, 0)


def test_uuid_in_any_spelling_is_one_key_and_no_drift(dsn: str, tmp_path: Path) -> None:
    first = [
        {"id": str(U1).upper(), "code": "a"},
        {"id": "{" + str(U2) + "}", "code": "b"},
        {"id": U3.hex.upper(), "code": "c"},
    ]
    # The same keys spelled otherwise: updates of the same rows, not new ones.
    second = [{"id": U1, "code": "a2"}, {"id": str(U2), "code": "b2"}]
    results = _run(dsn, tmp_path, "docs", ["id"], [first, second])
    assert all(isinstance(r, CommitSucceeded) for r in results), results
    assert _sql(dsn, "SELECT id::text, code FROM docs ORDER BY id") == [
        (str(U1), "a2  "),
        (str(U3), "c   "),
        (str(U2), "b2  "),
    ]
    assert _verify(dsn, tmp_path, "docs") == (0, 0, 0)
    assert _repair(dsn, tmp_path, "docs") == (0, 0, 0)
    _sql(dsn, "UPDATE docs SET code = 'zz' WHERE id = %s", U3)
    assert _repair(dsn, tmp_path, "docs") == (0, 0, 1)
    assert _verify(dsn, tmp_path, "docs") == (0, 0, 0)


def test_uuid_objects_through_an_explicit_key(dsn: str, tmp_path: Path) -> None:
    expected = ExpectedState(str(tmp_path), "shop", {"docs": ["id"]})
    sink = postgres_sink(dsn, "docs", name="docs", key=("id",))
    cycle = CommitCycle("shop", [sink], expected_state=expected)
    cycle.start()
    try:
        rows = [{"id": U1, "code": "k"}, Change("upsert", {"id": str(U2).upper(), "code": "l"})]
        result = cycle.run_epoch(0, {"docs": rows})
    finally:
        cycle.close()
    assert isinstance(result, CommitSucceeded), result
    assert _sql(dsn, "SELECT id::text FROM docs ORDER BY id") == [(str(U1),), (str(U2),)]
    assert _verify(dsn, tmp_path, "docs") == (0, 0, 0)


@pytest.mark.parametrize(
    ("column", "value", "why"),
    [
        ("id", "not-a-uuid", "not a UUID"),
        ("doc", "{not json", "not JSON"),
        ("code", "toolong", "longer than 4"),
    ],
)
def test_a_bad_value_is_refused_naming_table_column_and_value(
    dsn: str, tmp_path: Path, column: str, value: str, why: str
) -> None:
    row: dict[str, Any] = {"id": U1, "code": "ok", column: value}
    result = _run(dsn, tmp_path, "docs", ["id"], [[row]])[0]
    assert isinstance(result, CommitFatal), result
    for part in ("'docs'", repr(column), value, why):
        assert part in result.reason, (part, result.reason)
    assert _sql(dsn, "SELECT count(*) FROM docs") == [(0,)]


def test_char_keys_write_compare_and_repair_with_their_padding(dsn: str, tmp_path: Path) -> None:
    first = [{"code": "ab", "n": 1}, {"code": "cd   ", "n": 2}, {"code": "efghi", "n": 3}]
    second = [{"code": "ab ", "n": 10}, Change("delete", {"code": "cd"})]
    results = _run(dsn, tmp_path, "codes", ["code"], [first, second])
    assert all(isinstance(r, CommitSucceeded) for r in results), results
    assert _sql(dsn, "SELECT code, octet_length(code), n FROM codes ORDER BY code") == [
        ("ab   ", 5, 10),
        ("efghi", 5, 3),
    ]
    assert _verify(dsn, tmp_path, "codes") == (0, 0, 0)
    _sql(dsn, "UPDATE codes SET n = 99 WHERE code = 'ab'")
    _sql(dsn, "INSERT INTO codes VALUES ('zz', 1, 1)")
    assert _repair(dsn, tmp_path, "codes") == (0, 1, 1)
    assert _sql(dsn, "SELECT code, n FROM codes ORDER BY code") == [("ab   ", 10), ("efghi", 3)]
    assert _verify(dsn, tmp_path, "codes") == (0, 0, 0)


def test_arrow_batches_take_the_same_forms(dsn: str, tmp_path: Path) -> None:
    batch = pa.table({
        "id": pa.array([str(U1).upper(), "{" + str(U2) + "}"]),
        "code": pa.array(["a", "bcd"]),
        "doc": pa.array(['{"b": 1, "a": [true]}', "null"]),
        "raw": pa.array(['[1,2]', None]),
        "tag": pa.array(["q", None]),
    })  # fmt: skip
    results = _run(dsn, tmp_path, "docs", ["id"], [batch])
    assert all(isinstance(r, CommitSucceeded) for r in results), results
    assert _sql(dsn, "SELECT id::text, code, doc::text, jsonb_typeof(doc), tag FROM docs "
                     "ORDER BY id") == [
        (str(U1), "a   ", '{"a": [true], "b": 1}', "object", "q  "),
        (str(U2), "bcd ", "null", "null", None),
    ]  # fmt: skip
    assert _verify(dsn, tmp_path, "docs") == (0, 0, 0)
