"""The demo's data: TPC-H ``orders`` and ``lineitem``, and lineitem cut into epoch files.

``tpchgen-cli`` (PyPI) generates the tables offline as Parquet. Lineitem is
cut into ``epochs`` files by ascending ranges of ``l_orderkey``, so that each
file carries every line of its orders. Dropping a file into the watched
folder is the event the stream reacts to: its modification time is the event
time of its rows (a file is written beside the folder and renamed in, so it
appears whole).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
import pyarrow.compute as pc  # type: ignore[import-untyped, unused-ignore]
import pyarrow.parquet as pq  # type: ignore[import-untyped, unused-ignore]

from reconcile.core.contract import ConfigurationError

__all__ = [
    "LINEITEM_SPARK_SCHEMA",
    "SINK_TABLES_SQL",
    "Feed",
    "Truth",
    "generate",
    "plain_strings",
    "truth",
]

LINEITEM_COLUMNS = (
    ("l_orderkey", "long", "bigint"),
    ("l_partkey", "long", "bigint"),
    ("l_suppkey", "long", "bigint"),
    ("l_linenumber", "int", "integer"),
    ("l_quantity", "decimal(15,2)", "numeric(15,2)"),
    ("l_extendedprice", "decimal(15,2)", "numeric(15,2)"),
    ("l_discount", "decimal(15,2)", "numeric(15,2)"),
    ("l_tax", "decimal(15,2)", "numeric(15,2)"),
    ("l_returnflag", "string", "text"),
    ("l_linestatus", "string", "text"),
    ("l_shipdate", "date", "date"),
    ("l_commitdate", "date", "date"),
    ("l_receiptdate", "date", "date"),
    ("l_shipinstruct", "string", "text"),
    ("l_shipmode", "string", "text"),
    ("l_comment", "string", "text"),
)
LINEITEM_SPARK_SCHEMA = ", ".join(f"{name} {spark}" for name, spark, _ in LINEITEM_COLUMNS)

# The sink tables, in the target database's public schema. ``_epoch`` holds the
# epoch that wrote each row (the engine fills it).
SINK_TABLES_SQL = (
    "CREATE TABLE IF NOT EXISTS public.demo_lineitem ("
    + ", ".join(f"{name} {pg} NOT NULL" for name, _, pg in LINEITEM_COLUMNS)
    + ", _epoch bigint, PRIMARY KEY (l_orderkey, l_linenumber))",
    "CREATE TABLE IF NOT EXISTS public.demo_customer_revenue ("
    "o_custkey bigint PRIMARY KEY, revenue numeric(18,4) NOT NULL, lines bigint NOT NULL, "
    "_epoch bigint)",
)


def _tpchgen() -> str:
    """The ``tpchgen-cli`` beside this interpreter (a venv), else on PATH."""
    beside = Path(sys.executable).parent / "tpchgen-cli"
    if beside.exists():
        return str(beside)
    found = shutil.which("tpchgen-cli")
    if found is None:
        raise ConfigurationError(
            "tpchgen-cli not found: pip install tpchgen-cli (it is a dependency of "
            "reconcile-engine; run scripts/setup)"
        )
    return found


def generate(folder: Path, scale: float) -> Path:
    """``orders.parquet`` and ``lineitem.parquet`` at ``scale`` in ``folder`` (once).

    Raises:
        ConfigurationError: tpchgen-cli is missing, or fails (its output named).
    """
    done = folder / f".generated-{scale}"
    if done.exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    cmd = [_tpchgen(), "parquet", "-s", str(scale), "--tables=orders,lineitem",
           "-o", str(folder)]  # fmt: skip
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        raise ConfigurationError(
            f"tpchgen-cli failed ({result.returncode}) at scale {scale}: {result.stderr[-2000:]}"
        )
    done.touch()
    return folder


def plain_strings(table: pa.Table) -> pa.Table:
    """String views as plain strings: every reader (Spark, psycopg) takes those."""
    fields = [
        pa.field(f.name, pa.string(), f.nullable) if pa.types.is_string_view(f.type) else f
        for f in table.schema
    ]
    return table.cast(pa.schema(fields))


@dataclass(frozen=True)
class Slice:
    """One epoch file: the lines of orders ``lo <= l_orderkey < hi``."""

    index: int
    lo: int
    hi: int
    rows: int


class Feed:
    """Lineitem as ``epochs`` files dropped, one at a time, into ``inbox``.

    A file is written in ``inbox/../feed-tmp`` and renamed in, so the stream
    never sees half a file; dropping one that is there already does nothing
    (a resumed demo drops only the rest).
    """

    def __init__(self, tpch: Path, inbox: Path, epochs: int) -> None:
        if epochs < 1:
            raise ConfigurationError(f"--epochs must be at least 1, got {epochs}")
        self.inbox = inbox
        self.tmp = inbox.parent / "feed-tmp"
        inbox.mkdir(parents=True, exist_ok=True)  # the stream watches it from the start
        lineitem = plain_strings(pq.read_table(tpch / "lineitem.parquet"))
        self.lineitem = lineitem.sort_by(
            [("l_orderkey", "ascending"), ("l_linenumber", "ascending")]
        )
        keys = pc.unique(self.lineitem.column("l_orderkey")).to_pylist()
        if epochs > len(keys):
            raise ConfigurationError(
                f"--epochs {epochs} is more than the {len(keys)} orders at this scale"
            )
        self.slices: list[Slice] = []
        column = self.lineitem.column("l_orderkey")
        for i in range(epochs):
            lo = keys[i * len(keys) // epochs]
            hi = keys[(i + 1) * len(keys) // epochs] if i + 1 < epochs else keys[-1] + 1
            rows = pc.sum(pc.and_(pc.greater_equal(column, lo), pc.less(column, hi))).as_py()
            self.slices.append(Slice(i, lo, hi, int(rows)))

    def path(self, index: int) -> Path:
        return self.inbox / f"lineitem-{index:06d}.parquet"

    def dropped(self) -> list[int]:
        """The files in the inbox already (a resumed run goes on after them)."""
        return [s.index for s in self.slices if self.path(s.index).exists()]

    def write_ahead(self, indices: list[int]) -> None:
        """Write files ``indices`` beside the inbox now, so that dropping them is a rename.

        A feed as fast as the stream goes drops every file at once: written at
        the drop, the files would land one Parquet write apart, and the writing
        would take the CPU from the stream it feeds.
        """
        for index in indices:
            target = self.path(index)
            if not target.exists():
                self._write(index, self.tmp / target.name)

    def _write(self, index: int, staged: Path) -> None:
        part = self.slices[index]
        column = self.lineitem.column("l_orderkey")
        rows = self.lineitem.filter(
            pc.and_(pc.greater_equal(column, part.lo), pc.less(column, part.hi))
        )
        self.tmp.mkdir(parents=True, exist_ok=True)
        # Whole or absent: a feed killed mid-write leaves a ``.part``, never a
        # half file that a later drop would rename into the inbox.
        partial = staged.with_name(staged.name + ".part")
        pq.write_table(rows, partial)
        os.replace(partial, staged)

    def drop(self, index: int) -> float:
        """Drop file ``index`` (if it is not there yet); its event time (mtime)."""
        target = self.path(index)
        if not target.exists():
            staged = self.tmp / target.name
            if not staged.exists():
                self._write(index, staged)
            self.inbox.mkdir(parents=True, exist_ok=True)
            os.replace(staged, target)
            # The event is the drop: a file written ahead keeps its writing time else.
            os.utime(target)
        return target.stat().st_mtime

    def event_times(self) -> list[tuple[int, int, float]]:
        """(lo, hi, event time) of every dropped file."""
        return [
            (s.lo, s.hi, self.path(s.index).stat().st_mtime)
            for s in self.slices
            if self.path(s.index).exists()
        ]


@dataclass
class Truth:
    """What the sinks must hold, computed from the generated files alone (not the store)."""

    lines: int
    revenue: dict[int, Decimal]  # o_custkey -> sum of l_extendedprice * (1 - l_discount)
    count: dict[int, int]  # o_custkey -> lines


def truth(tpch: Path) -> Truth:
    """The sink tables' contents after every epoch, straight from TPC-H (exact decimals)."""
    orders = pq.read_table(tpch / "orders.parquet", columns=["o_orderkey", "o_custkey"])
    customer = dict(
        zip(orders.column("o_orderkey").to_pylist(), orders.column("o_custkey").to_pylist(),
            strict=True)
    )  # fmt: skip
    lineitem = pq.read_table(
        tpch / "lineitem.parquet", columns=["l_orderkey", "l_extendedprice", "l_discount"]
    )
    revenue: dict[int, Decimal] = defaultdict(Decimal)
    count: dict[int, int] = defaultdict(int)
    for key, price, discount in zip(
        lineitem.column("l_orderkey").to_pylist(),
        lineitem.column("l_extendedprice").to_pylist(),
        lineitem.column("l_discount").to_pylist(),
        strict=True,
    ):
        cust = customer[key]
        revenue[cust] += price * (1 - discount)
        count[cust] += 1
    return Truth(lineitem.num_rows, dict(revenue), dict(count))
