"""The CSV the Postgres sink COPYs is the rows' CSV whatever the table's chunk layout.

pyarrow 26's CSV writer emits garbage for a table whose columns have several
chunks, the first one empty (what slicing and concatenating epochs makes): NUL
bytes, or bytes of other rows that may parse as valid rows. The sink writes
through ``write_csv``, which must give the same bytes as a freshly built table.
"""

from __future__ import annotations

import io
import random

import pyarrow as pa
import pyarrow.csv as pacsv

from sinks.postgres.apply import write_csv

OPTIONS = pacsv.WriteOptions(include_header=False)


def _csv(table: pa.Table) -> bytes:
    out = io.BytesIO()
    write_csv(table, out, OPTIONS)
    return out.getvalue()


def _reference(table: pa.Table) -> bytes:
    out = io.BytesIO()
    pacsv.write_csv(pa.Table.from_pylist(table.to_pylist(), schema=table.schema), out, OPTIONS)
    return out.getvalue()


def test_an_empty_first_chunk_gives_the_rows_csv() -> None:
    table = pa.table(
        {
            "id": pa.chunked_array([pa.array([], pa.int64()), pa.array([1, 2, 3])]),
            "s": pa.chunked_array([pa.array([], pa.string()), pa.array(["a", None, "c"])]),
        }
    )
    assert _csv(table) == b'1,"a"\n2,\n3,"c"\n'


def test_any_chunk_layout_gives_the_rows_csv() -> None:
    rng = random.Random(7)
    for _ in range(500):
        n = rng.randint(0, 20)
        base = pa.table(
            {
                "i": pa.array(
                    [rng.choice([None, rng.randint(-9, 99)]) for _ in range(n)], pa.int64()
                ),
                "s": pa.array([rng.choice([None, "x", "yy", ""]) for _ in range(n)], pa.string()),
            }
        )
        parts, pos = [], 0
        while pos < n or not parts:
            k = rng.randint(0, n - pos)
            parts.append(base.slice(pos, k))
            pos += k
            if pos >= n and rng.random() < 0.5:
                break
        table = pa.concat_tables(parts)
        if table.num_rows and rng.random() < 0.5:
            table = table.slice(rng.randint(0, table.num_rows - 1))
        assert _csv(table) == _reference(table), [len(c) for c in table.column(0).chunks]
