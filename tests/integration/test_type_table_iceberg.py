"""Every row of Iceberg's type table (``ICEBERG_TYPES``), on a real catalog and warehouse.

Parametrized over the table itself, as ``test_type_table_pg.py`` is: a row
added to ``ICEBERG_TYPES`` is tested here, and fails until it has samples.
A sample's ``ddl`` is the Arrow type the sink is given to create the table
with (``schema=``). Each held type is written through a commit cycle with an
expected state, verified at 0 drift, damaged in one value by writing the
table with pyiceberg directly, found once, repaired to what it was, and
verified clean. Each refused type is refused naming the column and the type,
with nothing written.
"""

from __future__ import annotations

import datetime as dt
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.expressions import EqualTo
from pyiceberg.table import Table
from pyiceberg.types import TimestampNanoType, TimestamptzNanoType, UnknownType

from reconcile import CommitCycle, CommitSucceeded
from reconcile.core.results import CommitFatal
from reconcile.engine.expected import ExpectedState
from reconcile.recovery import recover
from sinks.iceberg.sink import IcebergSink
from sinks.iceberg.type_table import ICEBERG_TYPES, IcebergColumnType, iceberg_refusal
from tests.fix_iceberg import catalog_uri
from tests.type_samples import Refused, Sample, type_params

pytestmark = pytest.mark.integration

_DT = dt.datetime(2024, 3, 5, 1, 2, 3, 456789)
KOLKATA = dt.timezone(dt.timedelta(hours=5, minutes=30))

# Keyed by the row's ``sql`` (its first cell in docs/types.md); ddl: the declared Arrow type.
SAMPLES: dict[str, list[Sample | Refused]] = {
    "boolean": [Sample("bool", (True, False, None), False)],
    "int": [
        Sample("int32", (1, -(2**31), 2**31 - 1), 2),
        Sample("int8", (1, -128, 127), 2),
    ],
    "long": [Sample("int64", (2**53 + 1, -(2**63), 2**63 - 1), 2**53)],
    "float": [Sample("float32", (0.1, float("nan"), float("inf")), 0.2)],
    "double": [Sample("float64", (0.1, -0.0, 1e308), 0.10000000000000002)],
    "decimal(p, s)": [
        Sample("decimal(12,3)", (Decimal("1.500"), Decimal("-999999999.999"), 0), Decimal("1.501")),
        Sample("decimal(38,0)", (10**37, -(10**38 - 1), 7), 10**37 + 1),
    ],
    "string": [
        Sample("string", ("a", "ünï", ""), "b"),
        Sample("large_string", ("a", "x" * 1000, ""), "a "),
    ],
    "binary": [Sample("binary", (b"\x00", b"", b"ab"), b"ac")],
    "fixed(n)": [Sample("fixed(4)", (b"abcd", b"\x00\x00\x00\x00", None), b"abce")],
    "date": [
        Sample(
            "date32",
            (dt.date(2024, 3, 5), dt.date(1, 1, 1), dt.date(9999, 12, 31)),
            dt.date(2024, 5, 3),
        )
    ],
    "timestamp": [
        Sample("timestamp[us]", (_DT, dt.datetime(1900, 1, 1), None), _DT.replace(microsecond=1)),
        Sample("timestamp[ms]", (_DT.replace(microsecond=456000), None, None), _DT),
    ],
    "timestamptz": [
        Sample(
            "timestamp[us, UTC]",
            (_DT.replace(tzinfo=KOLKATA), _DT.replace(tzinfo=dt.UTC), None),
            _DT.replace(tzinfo=dt.UTC) + dt.timedelta(microseconds=1),
        )
    ],
    "uuid": [Refused("uuid", uuid.UUID(int=1).bytes)],
    "time": [Refused("time64[us]", dt.time(1, 2))],
    "struct, list, map": [
        Refused("list<int64>", [1, 2]),
        Refused("struct<a: int64>", {"a": 1}),
        Refused("map<string, int64>", [("a", 1)]),
    ],
    "timestamp_ns, timestamptz_ns, unknown, variant, geometry and every other type": [
        # Format v3 types, in tables the sink never creates (pyiceberg makes a declared
        # timestamp[ns] microseconds in a v2 table): the type table's answer is checked.
        Refused("timestamp_ns", None),
    ],
}

ARROW = {
    "bool": pa.bool_(), "int32": pa.int32(), "int8": pa.int8(), "int64": pa.int64(),
    "float32": pa.float32(), "float64": pa.float64(), "decimal(12,3)": pa.decimal128(12, 3),
    "decimal(38,0)": pa.decimal128(38, 0), "string": pa.string(),
    "large_string": pa.large_string(), "binary": pa.binary(), "fixed(4)": pa.binary(4),
    "date32": pa.date32(), "timestamp[us]": pa.timestamp("us"),
    "timestamp[ms]": pa.timestamp("ms"), "timestamp[us, UTC]": pa.timestamp("us", tz="UTC"),
    "uuid": pa.uuid(), "time64[us]": pa.time64("us"), "list<int64>": pa.list_(pa.int64()),
    "struct<a: int64>": pa.struct([("a", pa.int64())]),
    "map<string, int64>": pa.map_(pa.string(), pa.int64()),
}  # fmt: skip

# The default tier's share: one of each way a type is held, and one refused.
DEFAULT_TIER = {"int8", "decimal(12,3)", "large_string", "fixed(4)", "timestamp[ms]",
                "timestamp[us, UTC]", "time64[us]"}  # fmt: skip


def _sink(root: Path, typ: pa.DataType | None = None) -> IcebergSink:
    schema = None if typ is None else pa.schema([("k", pa.int64()), ("v", typ)])
    return IcebergSink("t", catalog_uri(root) + "&namespace=shop&key=k", schema=schema)


def _write(root: Path, typ: pa.DataType, epochs: list[list[dict[str, Any]]]) -> list[Any]:
    expected = ExpectedState(str(root / "expected"), "shop", {"t": ["k"]})
    cycle = CommitCycle("shop", [_sink(root, typ)], expected_state=expected)
    cycle.start()
    try:
        return [cycle.run_epoch(i, {"t": rows}) for i, rows in enumerate(epochs)]
    finally:
        cycle.close()


def _recover(root: Path, *, dry_run: bool) -> tuple[int, int, int]:
    dsn = catalog_uri(root) + "&namespace=shop"
    report = recover(dsn, str(root / "expected"), "shop", "t", mode="full", dry_run=dry_run,
                     allow_mass_change=True)  # fmt: skip
    return report.missing, report.extra, report.changed


def _table(root: Path) -> Table:
    # A client of its own: nothing of the sink's is reused.
    table = _sink(root).table()
    assert table is not None
    return table


def _rows(root: Path) -> list[dict[str, Any]]:
    data = _table(root).scan().to_arrow().select(["k", "v"]).sort_by("k").to_pylist()
    # NaN is not equal to itself; its text is.
    return [{k: ("NaN" if v != v else v) for k, v in row.items()} for row in data]


@pytest.mark.parametrize(
    ("entry", "sample"), list(type_params(ICEBERG_TYPES, SAMPLES, DEFAULT_TIER))
)
def test_each_row_of_the_type_table(
    tmp_path: Path, entry: IcebergColumnType, sample: Sample | Refused | None
) -> None:
    assert sample is not None, f"no samples for the type table's row {entry.doc.sql!r}: add some"
    assert isinstance(sample, Sample) == (not entry.doc.refused), (entry.doc.sql, sample)
    if isinstance(sample, Refused) and sample.ddl == "timestamp_ns":
        for v3 in (TimestampNanoType(), TimestamptzNanoType(), UnknownType()):
            assert iceberg_refusal(v3) == f"{v3} ({entry.doc.refused})"
        return
    typ = ARROW[sample.ddl]
    if isinstance(sample, Refused):
        # The table made by someone else, with pyiceberg: the refusal is the type table's.
        catalog = _sink(tmp_path).catalog()
        catalog.create_namespace_if_not_exists("shop")
        fields = [pa.field("k", pa.int64(), nullable=False), pa.field("v", typ),
                  pa.field("_epoch", pa.int64())]  # fmt: skip
        catalog.create_table("shop.t", schema=pa.schema(fields))
        result = _write(tmp_path, typ, [[{"k": 1, "v": sample.value}]])[0]
        assert isinstance(result, CommitFatal), result
        for part in ("'t'", "column 'v' is ", entry.doc.refused):
            assert part in result.reason, (part, result.reason)
        assert _table(tmp_path).scan().to_arrow().num_rows == 0
        # Given as the sink's own schema=, the store refuses the type before the table is made.
        declared = _write(tmp_path / "declared", typ, [[{"k": 1, "v": sample.value}]])[0]
        assert isinstance(declared, CommitFatal), declared
        assert "column 'v' has type" in declared.reason, declared.reason
        assert _sink(tmp_path / "declared").table() is None
        return
    rows = [{"k": k, "v": v} for k, v in enumerate(sample.values, start=1)]
    results = _write(tmp_path, typ, [rows])
    assert isinstance(results[0], CommitSucceeded), results
    column = _table(tmp_path).schema().find_field("v")
    assert isinstance(column.field_type, entry.classes), (column, entry.doc.sql)
    written = _rows(tmp_path)
    assert [r["k"] for r in written] == [1, 2, 3]
    assert _recover(tmp_path, dry_run=True) == (0, 0, 0)
    # One value changed by hand, with pyiceberg itself.
    table = _table(tmp_path)
    row = table.scan(row_filter=EqualTo("k", 1)).to_arrow()
    index = row.schema.get_field_index("v")
    damaged = pa.array([sample.damage], row.schema.field("v").type)
    table.overwrite(row.set_column(index, row.schema.field("v"), damaged), EqualTo("k", 1))
    assert _rows(tmp_path) != written, "the damage changed nothing"
    assert _recover(tmp_path, dry_run=True) == (0, 0, 1)
    assert _recover(tmp_path, dry_run=False) == (0, 0, 1)
    assert _rows(tmp_path) == written
    assert _recover(tmp_path, dry_run=True) == (0, 0, 0)
