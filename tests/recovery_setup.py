"""Test set-up for pull-and-diff recovery: a real sink table written by a real commit cycle.

A ``Setup`` is a Postgres table written epoch by epoch through ``CommitCycle``
and the Postgres sink (so it has markers, a fence and ``_epoch``), and the
expected-state store of the same epochs. Helpers read both sides directly
(psycopg and the store's snapshot), corrupt the sink by hand, and ask reladiff,
an independent tool, whether two tables match.
"""

from __future__ import annotations

import datetime as dt
import decimal
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pyarrow as pa
from psycopg import sql

from expected_state.store import ExpectedStateStore
from reconcile import CommitCycle, CommitSucceeded
from reconcile.core.contract import Change
from sinks.postgres.factory import postgres_sink

UTC = dt.UTC

# The types table: composite text + uuid key, every supported value type, NULLs.
TYPES_SCHEMA = pa.schema(
    [
        ("region", pa.string()),
        ("id", pa.string()),
        ("amount", pa.decimal128(12, 2)),
        ("ratio", pa.float64()),
        ("at", pa.timestamp("us")),
        ("at_tz", pa.timestamp("us", tz="UTC")),
        ("day", pa.date32()),
        ("flag", pa.bool_()),
        ("blob", pa.binary()),
        ("note", pa.string()),
        ("qty", pa.int32()),
    ]
)
TYPES_DDL = (
    "CREATE TABLE {} (region text NOT NULL, id uuid NOT NULL, amount numeric(12,2), "
    "ratio float8, at timestamp, at_tz timestamptz, day date, flag boolean, blob bytea, "
    "note text, qty integer, _epoch bigint, PRIMARY KEY (region, id))"
)
TYPES_KEYS = ["region", "id"]

SIMPLE_SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("total", pa.int64())])
SIMPLE_DDL = "CREATE TABLE {} (id bigint PRIMARY KEY, name text, total bigint, _epoch bigint)"


def types_row(rng: Any, region: str | None = None) -> dict[str, Any]:
    """A random row of the types table (some values NULL)."""

    def maybe(value: Any) -> Any:
        return None if rng.random() < 0.15 else value

    return {
        "region": region or rng.choice(["eu", "us", "ap", "żółw", "a|b"]),
        "id": str(uuid.UUID(int=rng.getrandbits(128))),
        "amount": maybe(decimal.Decimal(rng.randrange(-(10**8), 10**8)) / 100),
        "ratio": maybe(rng.choice([0.0, -1.5, 1e300, rng.random()])),
        "at": maybe(dt.datetime(2020, 1, 1) + dt.timedelta(microseconds=rng.randrange(10**14))),
        "at_tz": maybe(
            dt.datetime(1990, 1, 1, tzinfo=UTC) + dt.timedelta(microseconds=rng.randrange(10**15))
        ),
        "day": maybe(dt.date(1970, 1, 1) + dt.timedelta(days=rng.randrange(-3000, 30000))),
        "flag": maybe(rng.random() < 0.5),
        "blob": maybe(bytes(rng.randrange(256) for _ in range(rng.randrange(0, 12)))),
        "note": maybe(rng.choice(["", "x", "héllo", "line\nbreak", "1:2|3"])),
        "qty": maybe(rng.randrange(-(2**31), 2**31)),
    }


@dataclass
class Setup:
    """A sink table and its expected state, written epoch by epoch."""

    dsn: str
    root: str
    table: str
    schema: pa.Schema
    keys: list[str]
    pipeline: str = "shop"
    epoch: int = -1
    state: str = ""
    generation: int = 0  # the store writer's
    rows: dict[tuple[Any, ...], dict[str, Any]] = field(default_factory=dict)

    @property
    def store(self) -> ExpectedStateStore:
        return ExpectedStateStore(self.root, self.pipeline, self.table, self.keys)

    def key(self, row: dict[str, Any]) -> tuple[Any, ...]:
        return tuple(row[k] for k in self.keys)

    def record(
        self, upserts: Sequence[dict[str, Any]], deletes: Sequence[dict[str, Any]] = ()
    ) -> int:
        """Record the next epoch in the store only (a sink that is behind)."""
        self.epoch += 1
        changes = [Change("upsert", r) for r in upserts] + [Change("delete", d) for d in deletes]
        ExpectedStateStore(
            self.root,
            self.pipeline,
            self.table,
            self.keys,
            schema=self.schema,
            generation=self.generation,
        ).apply(self.epoch, changes, allow_gap=True)
        for r in upserts:
            self.rows[self.key(r)] = dict(r)
        for d in deletes:
            self.rows.pop(self.key(d), None)
        return self.epoch

    def write(
        self, upserts: Sequence[dict[str, Any]], deletes: Sequence[dict[str, Any]] = ()
    ) -> int:
        """The next epoch into the store and then the sink, through a commit cycle."""
        epoch = self.record(upserts, deletes)
        cycle = CommitCycle(
            self.pipeline,
            [postgres_sink(self.dsn, self.table, name=self.table, create_epoch_column=True)],
            self.state,
        )
        try:
            cycle.start()
            changes = [Change("upsert", r) for r in upserts] + [
                Change("delete", {k: d[k] for k in self.keys}) for d in deletes
            ]
            result = cycle.run_epoch(epoch, {self.table: changes})
            assert isinstance(result, CommitSucceeded), result
        finally:
            cycle.close()
        return epoch

    def execute(self, statement: str, *params: Any) -> int:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            cur = conn.execute(
                sql.SQL(statement).format(t=sql.Identifier(self.table)), params or None
            )
            return cur.rowcount

    def scalar(self, query: str, *params: Any) -> Any:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            row = conn.execute(
                sql.SQL(query).format(t=sql.Identifier(self.table)), params or None
            ).fetchone()
            return None if row is None else row[0]


def make_setup(
    dsn: str, root: str, table: str, schema: pa.Schema, ddl: str, keys: list[str]
) -> Setup:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL(ddl).format(sql.Identifier(table)))
    return Setup(dsn, root, table, schema, keys, state=f"{root}/progress")


def read_connection(dsn: str) -> psycopg.Connection[Any]:
    """A connection of the test's own that reads values the same whatever the defaults."""
    return psycopg.connect(
        dsn, autocommit=True, options="-c DateStyle=ISO -c bytea_output=hex -c extra_float_digits=3"
    )


def _norm(value: Any) -> Any:
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, memoryview):
        return bytes(value)
    return value


def sink_rows(setup: Setup) -> dict[tuple[Any, ...], dict[str, Any]]:
    """What the sink table holds, read with psycopg (not through recovery)."""
    names = setup.schema.names
    with read_connection(setup.dsn) as conn:
        cur = conn.execute(
            sql.SQL("SELECT {} FROM {}").format(
                sql.SQL(", ").join(map(sql.Identifier, names)), sql.Identifier(setup.table)
            )
        )
        rows = [dict(zip(names, map(_norm, r), strict=True)) for r in cur]
    return {setup.key(r): r for r in rows}


def expected_rows(setup: Setup) -> dict[tuple[Any, ...], dict[str, Any]]:
    """What the store says the sink must hold (its newest epoch)."""
    table = setup.store.snapshot(columns=setup.schema.names)
    return {setup.key(r): r for r in table.to_pylist()}


def load_plain(setup: Setup, name: str) -> None:
    """The expected state, loaded into a plain table of the sink's types (for reladiff)."""
    rows = setup.store.snapshot(columns=setup.schema.names).to_pylist()
    names = setup.schema.names
    with psycopg.connect(setup.dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP TABLE IF EXISTS {n}; CREATE TABLE {n} (LIKE {t})").format(
                n=sql.Identifier(name), t=sql.Identifier(setup.table)
            )
        )
        with conn.cursor().copy(
            sql.SQL("COPY {} ({}) FROM STDIN").format(
                sql.Identifier(name), sql.SQL(", ").join(map(sql.Identifier, names))
            )
        ) as copy:
            for row in rows:
                copy.write_row([row[n] for n in names])


def reladiff_differences(
    setup: Setup, other: str, columns: Sequence[str], algorithm: str = "hashdiff"
) -> list[tuple[str, tuple[Any, ...]]]:
    """reladiff's diff of the sink table against ``other``: every '+'/'-' row.

    hashdiff (checksums of key ranges, bisected) needs integer, UUID or
    alphanumeric keys; joindiff (an outer join in the database) takes any key.
    """
    import reladiff

    params = psycopg.conninfo.conninfo_to_dict(setup.dsn)
    url = f"postgresql://{params['user']}@{params['host']}:{params['port']}/{params['dbname']}"
    keys = tuple(setup.keys)
    extra = tuple(c for c in columns if c not in keys)
    a = reladiff.connect_to_table(url, setup.table, keys, extra_columns=extra)
    b = reladiff.connect_to_table(url, other, keys, extra_columns=extra)
    # skip_sort_results: reladiff cannot sort rows that hold NULLs (None < str).
    return list(reladiff.diff_tables(a, b, algorithm=algorithm, skip_sort_results=True))


def reladiff_equal_by_rank(setup: Setup, other: str) -> list[tuple[str, tuple[Any, ...]]]:
    """reladiff's hashdiff of two tables whose key reladiff cannot range over (text).

    Both sides are numbered in key order (a view with ``row_number()``) and
    diffed by that number with every column compared as text: equal tables give no
    difference, and any difference shows (as it shifts or changes a numbered row).
    """
    # Every column as its text (exact for floats too): reladiff would cast a float8
    # such as 1e300 to decimal(38, 13) and overflow.
    names = ", ".join(f'"{n}"::text AS "{n}"' for n in setup.schema.names)
    order = ", ".join(f'"{k}"' for k in setup.keys)
    for table, view in ((setup.table, "ranked_sink"), (other, "ranked_other")):
        setup.execute(
            f"CREATE OR REPLACE VIEW {view} AS SELECT row_number() OVER (ORDER BY {order}) AS rk, "
            f'{names} FROM "{table}"'
        )
    import reladiff

    params = psycopg.conninfo.conninfo_to_dict(setup.dsn)
    url = f"postgresql://{params['user']}@{params['host']}:{params['port']}/{params['dbname']}"
    extra = tuple(setup.schema.names)
    a = reladiff.connect_to_table(url, "ranked_sink", ("rk",), extra_columns=extra)
    b = reladiff.connect_to_table(url, "ranked_other", ("rk",), extra_columns=extra)
    return list(reladiff.diff_tables(a, b, algorithm="hashdiff", skip_sort_results=True))
