"""Benchmark: pull-and-diff recovery on PostgreSQL (full, scoped, buckets), raw COPY, reladiff.

One command; every ratio comes from one run on the same tables:

- full verify (pull with COPY into Arrow, hash, diff) of an N-row table, against a
  raw ``COPY ... TO STDOUT (FORMAT BINARY)`` read of the same table;
- recovery after a crash (the store holds an epoch the sink lacks) of 1, 100,
  10k and 1M divergent rows, scoped mode against full mode, on sinks of 1M and N;
- buckets mode against full mode finding 100 rows changed by hand;
- full verify against reladiff's hashdiff on the same two tables (the sink, and
  the expected state loaded into a plain table), with the same answer.

It starts its own throwaway PostgreSQL 15 (fsync on) and writes JSON, Markdown
and PNG plots to ``benchmarks/results/``.
"""

from __future__ import annotations

import argparse
import io
import json
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pyarrow as pa

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.recovery.report import markdown, plot  # noqa: E402
from benchmarks.report import machine, now, versions  # noqa: E402
from expected_state.store import ExpectedStateStore  # noqa: E402
from reconcile import recover  # noqa: E402
from reconcile.core.contract import OK, SinkTxnId  # noqa: E402
from reconcile.demo.embedded_pg import EmbeddedPostgres  # noqa: E402
from sinks.postgres.apply import write_csv  # noqa: E402
from sinks.postgres.sink import PostgresSink  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
DDL = (
    "CREATE TABLE {t} (id bigint PRIMARY KEY, name text, qty int4, price float8, "
    "at timestamptz, _epoch bigint); CREATE INDEX ON {t} (_epoch)"
)
SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("name", pa.string()),
        ("qty", pa.int32()),
        ("price", pa.float64()),
        ("at", pa.timestamp("us", tz="UTC")),
    ]
)
DIVERGENCES = (1, 100, 10_000, 1_000_000)


def rows(ids: np.ndarray[Any, Any], seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    n = len(ids)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "name": pa.array(np.char.add("customer-", (ids % 100_000).astype(str)).astype(object)),
            "qty": pa.array(rng.integers(1, 50, n, dtype=np.int32)),
            "price": pa.array(np.round(rng.random(n) * 1000, 2)),
            "at": pa.array(1_700_000_000_000_000 + ids * 1000, pa.timestamp("us", tz="UTC")),
        },
        schema=SCHEMA,
    )


def upserts(table: pa.Table) -> pa.Table:
    """The store's Arrow form of an epoch: the rows plus ``_op``."""
    return table.append_column("_op", pa.array(["upsert"] * table.num_rows, pa.string()))


class Sink:
    """One sink table of N rows and its expected state, written as epoch 0."""

    def __init__(self, dsn: str, root: str, table: str, n: int) -> None:
        self.dsn, self.root, self.table, self.n = dsn, root, table, n
        self.epoch = 0
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(DDL.format(t=table))
        data = rows(np.arange(n, dtype=np.int64), seed=1)
        store = ExpectedStateStore(root, "bench", table, ["id"], schema=SCHEMA)
        store.apply(0, upserts(data))
        sink = PostgresSink(dsn, table, name=table, pipeline="bench")
        txn = SinkTxnId("bench", table, 0, 0)
        assert sink.stage(txn, data) == OK
        assert sink.prepare(txn) == OK
        assert sink.commit(txn) == OK
        sink.close()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"VACUUM ANALYZE {table}")
            conn.execute("CHECKPOINT")

    def record(self, divergence: int, seed: int) -> None:
        """A crash: the store records an epoch the sink never got (half updates, half new keys)."""
        self.epoch += 1
        rng = np.random.default_rng(seed)
        updates = rng.choice(self.n, size=(divergence + 1) // 2, replace=False)
        fresh = np.arange(divergence // 2, dtype=np.int64) + self.n + seed * 10_000_000
        ids = np.concatenate([updates.astype(np.int64), fresh])
        store = ExpectedStateStore(self.root, "bench", self.table, ["id"], schema=SCHEMA)
        store.apply(self.epoch, upserts(rows(ids, seed=seed + 100)))

    def recover(self, mode: str, **options: Any) -> tuple[float, Any]:
        start = time.perf_counter()
        report = recover(self.dsn, self.root, "bench", self.table, mode=mode, **options)
        return time.perf_counter() - start, report


def raw_copy_seconds(dsn: str, table: str) -> tuple[float, int]:
    start = time.perf_counter()
    size = 0
    with (
        psycopg.connect(dsn) as conn,
        conn.cursor() as cur,
        cur.copy(f"COPY {table} TO STDOUT (FORMAT BINARY)") as copy,
    ):
        for block in copy:
            size += len(block)
    return time.perf_counter() - start, size


def load_plain(dsn: str, root: str, table: str, plain: str) -> None:
    expected = ExpectedStateStore(root, "bench", table, ["id"]).snapshot(columns=SCHEMA.names)
    import pyarrow.csv as pacsv

    buffer = io.BytesIO()
    write_csv(expected, buffer, pacsv.WriteOptions(include_header=False))
    with psycopg.connect(dsn) as conn:
        conn.execute(f"CREATE TABLE {plain} (LIKE {table})")
        with conn.cursor().copy(
            f"COPY {plain} ({', '.join(SCHEMA.names)}) FROM STDIN (FORMAT CSV)"
        ) as copy:
            view = buffer.getbuffer()
            for i in range(0, len(view), 1 << 20):
                copy.write(view[i : i + (1 << 20)])
            view.release()
        conn.commit()
        conn.autocommit = True
        conn.execute(f"ALTER TABLE {plain} ADD PRIMARY KEY (id)")
        conn.execute(f"VACUUM ANALYZE {plain}")


def reladiff_seconds(dsn: str, a: str, b: str) -> tuple[float, dict[str, int]]:
    import reladiff

    params = psycopg.conninfo.conninfo_to_dict(dsn)
    url = f"postgresql://{params['user']}@{params['host']}:{params['port']}/{params['dbname']}"
    extra = tuple(c for c in SCHEMA.names if c != "id")
    start = time.perf_counter()
    t1 = reladiff.connect_to_table(url, a, ("id",), extra_columns=extra)
    t2 = reladiff.connect_to_table(url, b, ("id",), extra_columns=extra)
    found = list(reladiff.diff_tables(t1, t2, algorithm="hashdiff", skip_sort_results=True))
    seconds = time.perf_counter() - start
    sides: dict[Any, set[str]] = {}
    for sign, row in found:
        sides.setdefault(row[0], set()).add(sign)
    counts = {
        "missing": sum(1 for s in sides.values() if s == {"+"}),
        "extra": sum(1 for s in sides.values() if s == {"-"}),
        "changed": sum(1 for s in sides.values() if s == {"-", "+"}),
    }
    return seconds, counts


def counts(report: Any) -> dict[str, int]:
    return {"missing": report.missing, "extra": report.extra, "changed": report.changed}


def run(args: argparse.Namespace) -> dict[str, Any]:
    server = EmbeddedPostgres(
        fsync="on",
        full_page_writes="on",
        shared_buffers="1GB",
        max_wal_size="8GB",
        checkpoint_timeout="30min",
        work_mem="256MB",
    )
    root = tempfile.mkdtemp(prefix="reconcile-bench-store-")
    result: dict[str, Any] = {
        "machine": machine(python=platform.python_version()),
        "versions": versions("pyarrow", "deltalake", "psycopg", "adbc-driver-postgresql"),
        "when": now(),
        "rows": args.rows,
        "small_rows": args.small,
    }
    try:
        dsn = server.dsn(server.create_database("bench"))
        with psycopg.connect(dsn) as conn:
            result["postgres"] = str(conn.execute("SHOW server_version").fetchone()[0])  # type: ignore[index]
        sizes = {"small": args.small, "big": args.rows}
        sinks = {}
        for label, n in sizes.items():
            t = time.perf_counter()
            sinks[label] = Sink(dsn, root, f"sink_{label}", n)
            print(f"loaded {n} rows in {time.perf_counter() - t:.1f}s", flush=True)
        big = sinks["big"]

        # 1. Full verify against a raw COPY read of the same table.
        copy_s, copy_bytes = min(raw_copy_seconds(dsn, big.table) for _ in range(2))
        full_runs = [big.recover("full", dry_run=True) for _ in range(2)]
        full_s = min(s for s, _ in full_runs)
        assert not full_runs[0][1].drift
        result["raw_copy_s"] = round(copy_s, 3)
        result["raw_copy_mb"] = round(copy_bytes / 1e6, 1)
        result["full_verify_s"] = round(full_s, 3)
        result["full_verify_rows_per_s"] = round(big.n / full_s)
        result["raw_copy_rows_per_s"] = round(big.n / copy_s)
        result["full_vs_copy_ratio"] = round(copy_s / full_s, 3)
        print(f"full verify {full_s:.2f}s vs raw COPY {copy_s:.2f}s", flush=True)
        # A first scheduled check in buckets mode: no summary is kept yet, so the
        # expected side checksums every row (and keeps the first level's figures).
        cold_s, cold_report = big.recover("buckets", dry_run=True)
        assert not cold_report.drift, cold_report
        result["buckets_cold_s"] = round(cold_s, 3)
        result["buckets_cold_vs_full_ratio"] = round(cold_s / full_s, 3)
        print(f"buckets, no summary yet: {cold_s:.2f}s", flush=True)

        # 2. Recovery after a crash, against divergence and size.
        table = []
        seed = 1
        for label, sink in sinks.items():
            for divergence in DIVERGENCES:
                if divergence > sink.n // 2:
                    continue
                row: dict[str, Any] = {"sink_rows": sink.n, "divergence": divergence}
                for mode in ("full", "scoped"):
                    seed += 1
                    sink.record(divergence, seed)
                    seconds, report = sink.recover(mode, after_crash=True)
                    assert report.missing + report.changed == divergence, (mode, report)
                    row[f"{mode}_s"] = round(seconds, 3)
                    row[f"{mode}_pulled"] = report.rows_pulled
                    print(f"{label} d={divergence} {mode}: {seconds:.2f}s", flush=True)
                row["scoped_vs_full"] = round(row["scoped_s"] / row["full_s"], 4)
                table.append(row)
        result["divergence"] = table
        hundred = next(r for r in table if r["sink_rows"] == big.n and r["divergence"] == 100)
        result["divergence_100_vs_full_ratio"] = hundred["scoped_vs_full"]

        # 3. Buckets against full, 100 rows changed by hand. A scheduled check
        # first: the divergence runs above changed about a fifth of the table
        # since the first check's summary, more than it is worth bringing
        # forward key by key, so this check computes it again from every row.
        again_s, again_report = big.recover("buckets", dry_run=True)
        assert not again_report.drift, again_report
        print(f"buckets after the divergence runs: {again_s:.2f}s", flush=True)
        with psycopg.connect(dsn, autocommit=True) as conn:
            ids = np.random.default_rng(5).choice(big.n, 100, replace=False).tolist()
            conn.execute(f"UPDATE {big.table} SET price = price + 1 WHERE id = ANY(%s)", (ids,))
        full_s2, full_report = big.recover("full", dry_run=True)
        buckets_s, buckets_report = big.recover("buckets", dry_run=True)
        assert (
            counts(full_report)
            == counts(buckets_report)
            == {
                "missing": 0,
                "extra": 0,
                "changed": 100,
            }
        ), (full_report, buckets_report)
        result["hand_changed"] = {
            "full_s": round(full_s2, 3),
            "buckets_s": round(buckets_s, 3),
            "buckets_compared": buckets_report.buckets_compared,
            "buckets_after_divergence_runs_s": round(again_s, 3),
            "buckets_pulled_rows": buckets_report.rows_pulled,
            "counts": counts(full_report),
        }
        result["buckets_vs_full_ratio"] = round(buckets_s / full_s2, 3)

        # 4. Full verify against reladiff's hashdiff, same two tables, same answer.
        load_plain(dsn, root, big.table, "expected_plain")
        reladiff_s, reladiff_counts = reladiff_seconds(dsn, big.table, "expected_plain")
        assert reladiff_counts == counts(full_report), (reladiff_counts, full_report)
        result["reladiff"] = {
            "hashdiff_s": round(reladiff_s, 3),
            "full_verify_s": round(full_s2, 3),
            "counts": reladiff_counts,
        }
        result["vs_reladiff_speedup"] = round(reladiff_s / full_s2, 3)

        # 5. The next scheduled check, one epoch later: the store records an epoch
        # of 1,000 rows (half updates) and the sink gets it (scoped recovery, as
        # after a crash); the kept summary is brought forward over that epoch.
        big.record(1000, seed=99)
        big.recover("scoped", after_crash=True)
        full_s3, full3 = big.recover("full", dry_run=True)
        forward_s, forward = big.recover("buckets", dry_run=True)
        assert counts(full3) == counts(forward), (full3, forward)
        result["next_epoch"] = {
            "full_s": round(full_s3, 3),
            "buckets_s": round(forward_s, 3),
            "counts": counts(full3),
        }
        result["buckets_forward_vs_full_ratio"] = round(forward_s / full_s3, 3)
        print(f"next epoch: buckets {forward_s:.2f}s vs full {full_s3:.2f}s", flush=True)
        return result
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=10_000_000, help="rows of the big sink")
    parser.add_argument("--small", type=int, default=1_000_000, help="rows of the small sink")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    result = run(args)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "recovery.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / "recovery.md").write_text(markdown(result))
    plot(result, args.out)
    print(json.dumps({k: result[k] for k in (
        "full_vs_copy_ratio", "divergence_100_vs_full_ratio", "buckets_vs_full_ratio",
        "vs_reladiff_speedup")}))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
