"""Key ranges as data: SQL that reads or checksums the rows of many key ranges of a Postgres table.

Buckets mode reads and checksums the rows of many ranges of the first key
column at once (every range that differs at one level of its search). The
ranges go to the server as array parameters, never as SQL text: the query's
text and its planning cost are the same for one range and for a hundred
thousand, and the work follows the rows in the ranges. Two plans:

- **indexed** (``RangeOrder.indexed``): a btree index leads with the first key
  column, in the order the ranges use (byte order for text). The ranges are
  ``unnest``-ed into rows and joined to the table by ``key >= lo AND key < hi``:
  a nested loop whose inner side is one index range scan per range, so the
  cost is one index descent per range plus the rows in them.
- **scan**: no such index (a text key under a linguistic collation, a key that
  leads no index). One pass over the table numbers every row's range with
  ``width_bucket`` over the ranges' sorted edges and keeps the rows of the
  wanted ones: the cost follows the table, never the table times the ranges.

A range unbounded below or above (the first and last of a search) cannot be a
row of the unnest (a NULL bound compares to nothing), so it gets its own arm of
a UNION ALL; a range unbounded on both sides is the whole table.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from psycopg import sql

from reconcile.core.target import KeyRange

__all__ = [
    "RANGE_KINDS",
    "Params",
    "Pieces",
    "RangeOrder",
    "leading_index_collations",
    "literal",
    "pieces_of",
    "range_order",
    "ranges_sql",
    "split_by_bounds",
]

# First key column kinds whose order is the same in PostgreSQL (text under
# COLLATE "C") and in Arrow, so that key ranges mean the same on both sides.
RANGE_KINDS = ("int", "numeric", "text", "uuid", "date", "timestamp", "timestamptz")
# pg_collation OIDs fixed at initdb: "default", "C" and "POSIX".
_DEFAULT_COLLATION = 100
_BYTE_ORDER_COLLATIONS = (950, 951)

# A query that returns rows: (SQL text with $n placeholders, parameters) -> rows.
Rows = Callable[[str, Sequence[Any]], list[tuple[Any, ...]]]


def literal(value: Any) -> str:
    """A key value as the text PostgreSQL parses back into the column's type."""
    if hasattr(value, "isoformat"):
        return str(value.isoformat())
    if isinstance(value, bytes):
        return value.hex()
    return str(value)


@dataclass
class Params:
    """Positional parameters (``$1``, ``$2``, ...) added as a query is composed."""

    values: list[Any] = field(default_factory=list)

    def add(self, value: Any) -> sql.Composable:
        self.values.append(value)
        return sql.SQL(f"${len(self.values)}")


@dataclass(frozen=True)
class RangeOrder:
    """How the first key column is compared with range bounds, and whether an index serves it.

    Attributes:
        key: the column as an expression that orders like the ranges (byte
            order for text: ``COLLATE "C"``, or the bare column where its own
            collation is already byte order, which keeps its index usable).
        cast: the column's SQL type (bounds travel as text and are cast to it).
        indexed: a btree index on the column serves ``key >= lo AND key < hi``.
    """

    key: sql.Composable
    cast: sql.Composable
    indexed: bool


def leading_index_collations(run: Rows, schema: str, table: str, column: str) -> list[int]:
    """The collation of each valid, non-partial btree index that leads with ``column`` (0: none)."""
    rows = run(
        "SELECT i.indcollation[0]::oid::int8 FROM pg_catalog.pg_index i "
        "JOIN pg_catalog.pg_class ic ON ic.oid = i.indexrelid "
        "JOIN pg_catalog.pg_am am ON am.oid = ic.relam "
        "JOIN pg_catalog.pg_class c ON c.oid = i.indrelid "
        "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
        "JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid AND a.attnum = i.indkey[0] "
        "WHERE n.nspname = $1 AND c.relname = $2 AND a.attname = $3 AND am.amname = 'btree' "
        "AND i.indisvalid AND i.indpred IS NULL",
        [schema, table, column],
    )
    return [int(r[0]) for r in rows]


def range_order(
    run: Rows, schema: str, table: str, column: str, kind: str, sql_type: str
) -> RangeOrder:
    """The ``RangeOrder`` of ``column`` (of checksum ``kind``), from the catalog."""
    ident = sql.Identifier("t", column)
    cast = sql.SQL(sql_type)
    collations = leading_index_collations(run, schema, table, column)
    if kind != "text":
        return RangeOrder(ident, cast, bool(collations))
    byte_order = sql.SQL('{} COLLATE "C"').format(ident)
    if any(c in _BYTE_ORDER_COLLATIONS for c in collations):
        return RangeOrder(byte_order, cast, True)
    if _DEFAULT_COLLATION in collations:
        # The index is in the database's default collation: byte order only
        # where that is libc's C or POSIX. Then the bare column orders as the
        # ranges do, and only the bare column matches the index (the planner
        # matches collations by identity, and "C" is not "default").
        row = run(
            "SELECT d.datcollate, pg_catalog.to_jsonb(d) ->> 'datlocprovider' "
            "FROM pg_catalog.pg_database d WHERE d.datname = pg_catalog.current_database()",
            [],
        )
        if row and row[0][0] in ("C", "POSIX") and row[0][1] in (None, "c"):
            return RangeOrder(ident, cast, True)
    return RangeOrder(byte_order, cast, False)


@dataclass
class Pieces:
    """Disjoint key ranges, each with an id (a bucket number, or 1 for "wanted").

    Attributes:
        lows, highs, ids: the ranges bounded on both sides (bounds as text).
        head: (upper bound, id) of the range unbounded below, if any.
        tail: (lower bound, id) of the range unbounded above, if any.
        whole: the id of a range unbounded on both sides (the whole table).
        ranges: every range as (lo, hi, id), bounds as the values they are
            (the scan plan sorts them).
    """

    lows: list[str] = field(default_factory=list)
    highs: list[str] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)
    head: tuple[str, int] | None = None
    tail: tuple[str, int] | None = None
    whole: int | None = None
    ranges: list[tuple[Any, Any, int]] = field(default_factory=list)


def pieces_of(ranges: Sequence[KeyRange], ids: Sequence[int]) -> Pieces:
    """The pieces of disjoint ``ranges``, range ``i`` carrying ``ids[i]``."""
    out = Pieces()
    for within, b in zip(ranges, ids, strict=True):
        out.ranges.append((within.lo, within.hi, b))
        if within.lo is None and within.hi is None:
            out.whole = b
        elif within.lo is None:
            out.head = (literal(within.hi), b)
        elif within.hi is None:
            out.tail = (literal(within.lo), b)
        else:
            out.lows.append(literal(within.lo))
            out.highs.append(literal(within.hi))
            out.ids.append(str(b))
    return out


def split_by_bounds(bounds: Sequence[Any], within: Sequence[KeyRange]) -> Pieces:
    """``within``'s ranges cut at ``bounds``, each piece numbered as ``width_bucket`` would.

    A piece starting at value v gets the number of bounds <= v (0 below the
    first bound), so its rows count toward that bucket.
    """
    ranges: list[KeyRange] = []
    ids: list[int] = []
    for r in within:
        first = 0 if r.lo is None else bisect.bisect_right(bounds, r.lo)
        stop = len(bounds) if r.hi is None else bisect.bisect_left(bounds, r.hi)
        lo = r.lo
        for j in range(first, stop):
            ranges.append(KeyRange(lo, bounds[j]))
            ids.append(0 if lo is None else bisect.bisect_right(bounds, lo))
            lo = bounds[j]
        ranges.append(KeyRange(lo, r.hi))
        ids.append(0 if lo is None else bisect.bisect_right(bounds, lo))
    return pieces_of(ranges, ids)


def _scan_map(pieces: Pieces) -> tuple[list[str], list[str | None]]:
    """The sorted edges of every piece, and the piece id of each ``width_bucket`` of them."""
    values = sorted({v for lo, hi, _ in pieces.ranges for v in (lo, hi) if v is not None})
    ids: list[str | None] = [None] * (len(values) + 1)
    for lo, hi, b in pieces.ranges:
        # Bucket j holds [edge j-1, edge j): piece [lo, hi) covers buckets
        # (index of lo) + 1 through (index of hi).
        first = 0 if lo is None else bisect.bisect_left(values, lo) + 1
        last = len(values) if hi is None else bisect.bisect_left(values, hi)
        for j in range(first, last + 1):
            ids[j] = str(b)
    return [literal(v) for v in values], ids


def ranges_sql(
    order: RangeOrder,
    table: sql.Composable,
    select: sql.Composable,
    pieces: Pieces,
    params: Params,
    *,
    tagged: bool,
) -> sql.Composable:
    """``SELECT <select>`` over the table's rows in any of the pieces.

    Args:
        order: how the key compares, and which plan serves it.
        table: the table's qualified identifier (aliased ``t`` in the query).
        select: the columns or expressions of ``t`` to select.
        pieces: the ranges, as data.
        params: where the query's parameters are added.
        tagged: add the piece's id as a last column (``b``).
    """
    key, cast = order.key, order.cast

    def tag(value: sql.Composable) -> sql.Composable:
        return sql.SQL(", {} AS b").format(value) if tagged else sql.SQL("")

    if pieces.whole is not None:
        whole = (
            tag(sql.SQL("{}::int4").format(params.add(str(pieces.whole))))
            if tagged
            else sql.SQL("")
        )
        return sql.SQL("SELECT {}{} FROM {} AS t").format(select, whole, table)
    if not order.indexed:
        edges, ids = _scan_map(pieces)
        return sql.SQL(
            "SELECT {select}{tag} FROM {table} AS t CROSS JOIN LATERAL (SELECT "
            "({ids}::text[]::int4[])[pg_catalog.width_bucket({key}, {edges}::text[]::{cast}[]) + 1]"
            " AS b) AS m WHERE m.b IS NOT NULL"
        ).format(
            select=select,
            tag=tag(sql.SQL("m.b")),
            table=table,
            ids=params.add(ids),
            key=key,
            edges=params.add(edges),
            cast=cast,
        )
    arms = [
        sql.SQL(
            "SELECT {select}{tag} FROM ROWS FROM (pg_catalog.unnest({lo}::text[]::{cast}[]), "
            "pg_catalog.unnest({hi}::text[]::{cast}[]), pg_catalog.unnest({ids}::text[]::int4[])) "
            "AS r(lo, hi, b) JOIN {table} AS t ON {key} >= r.lo AND {key} < r.hi"
        ).format(
            select=select,
            tag=tag(sql.SQL("r.b")),
            lo=params.add(pieces.lows),
            hi=params.add(pieces.highs),
            ids=params.add(pieces.ids),
            cast=cast,
            table=table,
            key=key,
        )
    ]
    for bound, op in ((pieces.head, "<"), (pieces.tail, ">=")):
        if bound is None:
            continue
        value, b = bound
        # A parameter only where the query uses it (an unused one has no type).
        marked = tag(sql.SQL("{}::int4").format(params.add(str(b)))) if tagged else sql.SQL("")
        arms.append(
            sql.SQL("SELECT {}{} FROM {} AS t WHERE {} " + op + " {}::text::{}").format(
                select,
                marked,
                table,
                key,
                params.add(value),
                cast,
            )
        )
    return sql.SQL(" UNION ALL ").join(arms)
