"""Key ranges as data on a real server: the rows of many ranges, their checksums, plans and text.

Buckets mode reads and checksums the rows of thousands of key ranges at once.
These tests hold, on real tables of every first-key kind:

- the rows a range query returns are exactly the rows whose key lies in the
  ranges, in byte order, whatever the column's collation (checked against
  the keys read back with psycopg and compared in Python);
- the checksums of the pieces of some ranges equal those of the same buckets
  computed by the whole-table query (``test_checksum_pg.py`` holds that one
  against Python);
- the plan reads each range through the key's index (a nested loop over the
  ranges with an index range scan inside), or scans the table once where no
  index orders the key as the ranges do; never a scan per range;
- the server's own record of the statements (``pg_stat_statements``) shows
  one statement text, of bounded length, for ten ranges and for five thousand.
"""

from __future__ import annotations

import decimal
import json
import random
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from psycopg import sql

from reconcile.core.target import KeyRange
from sinks.postgres.bucket_sums import psycopg_query
from sinks.postgres.pull import PgSnapshot
from sinks.postgres.ranges import Params, pieces_of, ranges_sql
from sinks.postgres.sink import PostgresSink
from tests.fix_pg import PgServer

pytestmark = pytest.mark.integration

WORDS = ["a", "B", "b", "Z", "é", "ä", "zz", "Ä", "a b", "a-b", "ß", "日本", "", "0", "~"]


@dataclass
class Case:
    """A table whose first key column is of one kind."""

    name: str
    ddl: str
    schema: pa.Schema
    keys: list[str]
    indexed: bool

    def rows(self, n: int, rng: random.Random) -> list[tuple[Any, ...]]:
        out: dict[Any, tuple[Any, ...]] = {}
        while len(out) < n:
            value: Any
            if self.name in ("ints", "unindexed"):
                value = rng.randrange(-(10**6), 10**6)
            elif self.name == "nums":
                cents = decimal.Decimal(rng.randrange(-(10**6), 10**6)) / 100
                value = cents.quantize(decimal.Decimal("0.01"))
            elif self.name == "uuids":
                value = str(uuid.UUID(int=rng.getrandbits(128)))
            elif self.name == "composite":
                region = rng.choice(WORDS[:8])
                value = (region, rng.randrange(10**6))
                out[value] = (region, value[1], f"v{len(out)}")
                continue
            else:
                value = rng.choice(WORDS) + str(rng.randrange(10**5))
            out[value] = (value, f"v{len(out)}")
        return list(out.values())


CASES = [
    Case("ints", "(id bigint PRIMARY KEY, v text)", pa.schema([("id", pa.int64()),
         ("v", pa.string())]), ["id"], True),
    Case("nums", "(id numeric(12,2) PRIMARY KEY, v text)", pa.schema([("id", pa.decimal128(12, 2)),
         ("v", pa.string())]), ["id"], True),
    Case("uuids", "(id uuid PRIMARY KEY, v text)", pa.schema([("id", pa.string()),
         ("v", pa.string())]), ["id"], True),
    # The test servers' databases are in the C locale: the default collation
    # is byte order, and the bare column keeps its index usable.
    Case("text_default", "(id text PRIMARY KEY, v text)", pa.schema([("id", pa.string()),
         ("v", pa.string())]), ["id"], True),
    Case("text_c", '(id text COLLATE "C" PRIMARY KEY, v text)', pa.schema([("id", pa.string()),
         ("v", pa.string())]), ["id"], True),
    # A linguistic collation orders the index otherwise: one scan per query.
    Case("text_icu", '(id text COLLATE "und-x-icu" PRIMARY KEY, v text)',
         pa.schema([("id", pa.string()), ("v", pa.string())]), ["id"], False),
    Case("composite", "(region text, id int4, v text, PRIMARY KEY (region, id))",
         pa.schema([("region", pa.string()), ("id", pa.int32()), ("v", pa.string())]),
         ["region", "id"], True),
    # A first key column that leads no index (the primary key is (v, id)).
    Case("unindexed", "(id bigint NOT NULL, v text NOT NULL, PRIMARY KEY (v, id))",
         pa.schema([("id", pa.int64()), ("v", pa.string())]), ["id", "v"], False),
]  # fmt: skip


def load(dsn: str, case: Case, rows: list[tuple[Any, ...]]) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE TABLE {} " + case.ddl).format(sql.Identifier(case.name)))
        with conn.cursor().copy(
            sql.SQL("COPY {} FROM STDIN").format(sql.Identifier(case.name))
        ) as copy:
            for row in rows:
                copy.write_row(row)
        conn.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(case.name)))


@contextmanager
def snapshot(dsn: str, case: Case) -> Iterator[PgSnapshot]:
    sink = PostgresSink(dsn, case.name, name=case.name, key=case.keys)
    try:
        target = sink.recovery_target("p", None, write=False)
        with target.snapshot(case.schema, case.keys) as snap:
            yield snap
    finally:
        sink.close()


def random_ranges(values: list[Any], rng: random.Random) -> list[KeyRange]:
    """Disjoint ranges cut at random key values, some ends unbounded."""
    cuts = sorted(set(rng.sample(values, min(len(values), rng.randint(2, 40)))))
    edges: list[Any] = [None, *cuts, None]
    spans = [KeyRange(edges[i], edges[i + 1]) for i in range(len(edges) - 1)]
    return [r for r in spans if rng.random() < 0.5]


def inside(value: Any, ranges: list[KeyRange]) -> bool:
    return any((r.lo is None or r.lo <= value) and (r.hi is None or value < r.hi) for r in ranges)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_range_pulls_and_checksums_hold_the_rows_in_the_ranges(pg_db: str, case: Case) -> None:
    rng = random.Random(case.name)
    rows = case.rows(2000, rng)
    load(pg_db, case, rows)
    firsts = sorted({r[0] for r in rows})
    with snapshot(pg_db, case) as snap:
        assert snap.narrow_ranges is case.indexed
        for _ in range(8):
            ranges = random_ranges(firsts, rng)
            pulled = snap.pull_ranges(ranges)
            # numeric comes back as its text (an exact decimal).
            got = {tuple(map(str, r.values())) for r in pulled.select(case.keys).to_pylist()}
            want = {tuple(map(str, r[: len(case.keys)])) for r in rows if inside(r[0], ranges)}
            assert pulled.num_rows == len(want) and got == want
            # Bounds that include every range's edges (as a search's do): each
            # bucket is wholly inside the ranges or wholly outside them.
            extra = rng.sample(firsts, min(20, len(firsts)))
            edges = {v for r in ranges for v in (r.lo, r.hi) if v is not None}
            bounds = sorted(edges | set(extra))
            whole = snap.bucket_sums(bounds, [KeyRange()])
            narrow = snap.bucket_sums(bounds, ranges)
            lows = [None, *bounds]
            # Bucket 0 (below every bound) is inside only the range unbounded below.
            wanted = {
                b: figures
                for b, figures in whole.items()
                if (inside(lows[b], ranges) if b else any(r.lo is None for r in ranges))
            }
            assert narrow == wanted
        assert snap.pull_ranges([]).num_rows == 0
        assert snap.pull_ranges([KeyRange()]).num_rows == len(rows)


def plan_nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from plan_nodes(child)


def explain(dsn: str, query: sql.Composable, values: list[Any]) -> list[dict[str, Any]]:
    text, params = psycopg_query(query.as_string(None), values)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET jit = off")
        row = conn.execute("EXPLAIN (FORMAT JSON) " + text, params).fetchone()
    assert row is not None
    found = row[0] if isinstance(row[0], list) else json.loads(row[0])
    return list(plan_nodes(found[0]["Plan"]))


@pytest.mark.parametrize(
    "case", [c for c in CASES if c.name in ("ints", "text_default", "text_c", "text_icu")],
    ids=lambda c: c.name,
)  # fmt: skip
def test_many_ranges_are_read_through_the_key_index_or_in_one_scan(pg_db: str, case: Case) -> None:
    rng = random.Random(5)
    rows = case.rows(10_000, rng)
    load(pg_db, case, rows)
    firsts = sorted(r[0] for r in rows)
    # 1,000 narrow ranges, each of a few rows, none unbounded.
    ranges = [KeyRange(firsts[i], firsts[i + 3]) for i in range(0, 8_000, 8)]
    with snapshot(pg_db, case) as snap:
        for tagged, select in ((False, sql.SQL("t.v")), (True, sql.SQL("t.v AS c"))):
            params = Params()
            pieces = pieces_of(ranges, [1] * len(ranges))
            query = ranges_sql(
                snap.range_order(), snap.table.ident, select, pieces, params, tagged=tagged
            )
            nodes = explain(pg_db, query, params.values)
            on_table = [n for n in nodes if n.get("Relation Name") == case.name]
            assert len(on_table) == 1, nodes  # the table appears once in the plan
            scan = on_table[0]
            if case.indexed:
                assert scan["Node Type"] in ("Index Scan", "Index Only Scan"), scan
                assert ">= r.lo" in scan["Index Cond"] and "< r.hi" in scan["Index Cond"]
                assert any(n["Node Type"] == "Nested Loop" for n in nodes)
            else:
                # One pass over the table, each row's range found by width_bucket.
                assert scan["Node Type"] == "Seq Scan", scan
                assert "width_bucket" in scan["Filter"]


@pytest.fixture
def stats_server() -> Iterator[PgServer]:
    """A server of the test's own that records every statement's text (pg_stat_statements)."""
    server = PgServer(shared_preload_libraries="pg_stat_statements")
    yield server
    server.stop()


def test_the_server_records_one_bounded_statement_for_ten_ranges_and_five_thousand(
    stats_server: PgServer,
) -> None:
    case = CASES[0]
    db = stats_server.create_database("stm")
    dsn = stats_server.dsn(db)
    rows = case.rows(20_000, random.Random(9))
    load(dsn, case, rows)
    firsts = sorted(r[0] for r in rows)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION pg_stat_statements")
        conn.execute("SELECT pg_stat_statements_reset()")
    with snapshot(dsn, case) as snap:
        # The server records a statement when its portal closes, i.e. when the
        # session's next one starts: the last round only closes the others.
        for n in (10, 5000, 10):
            ranges = [KeyRange(firsts[i], firsts[i + 2]) for i in range(0, 3 * n, 3)]
            assert snap.pull_ranges(ranges).num_rows == 2 * n
            sums = snap.bucket_sums([r.hi for r in ranges], ranges)
            assert sum(count for count, _ in sums.values()) == 2 * n
    with psycopg.connect(dsn, autocommit=True) as conn:
        seen = conn.execute(
            "SELECT query, calls FROM pg_stat_statements WHERE query LIKE %s",
            ("%ROWS FROM%",),
        ).fetchall()
    # One statement text each for the pull and the checksums, the same for 10
    # ranges and for 5,000: the ranges were data.
    assert len(seen) == 2, [(len(q), c) for q, c in seen]
    assert all(calls >= 2 and len(query) < 2_000 for query, calls in seen), [
        (len(q), c) for q, c in seen
    ]
