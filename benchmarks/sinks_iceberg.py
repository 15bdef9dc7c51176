"""Benchmark: the Iceberg sink's small-epoch commit latency, big-epoch throughput, full verify.

``python -m benchmarks.sinks_iceberg [--small-epochs 300] [--rows 1000000] [--out DIR]``

On pyiceberg's SQL catalog (a SQLite file) and a local warehouse folder, on
this machine's disk, through the sink as the commit cycle drives it (bound to
a writer; stage, prepare, commit):

- small epochs: ``--small-epochs`` epochs of 100 rows (90 new keys, 10 keys of
  the epoch before upserted again, so each epoch rewrites one earlier file):
  prepare + commit time per epoch, p50 and p95 (the first 10 % left out as
  warm-up);
- big epochs: ``--rows`` rows as one Arrow table, once as new keys (an append)
  and once again with the same keys (every row upserted: every file rewritten),
  rows/s of prepare + commit;
- full verify: ``reconcile.recover(mode="full", dry_run=True)`` of the big
  table against an expected-state store holding the same rows: rows/s.

Writes its part, under the key ``iceberg``, into ``<out>/sinks.json`` (the
other sinks' parts in that file are kept).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.report import RESULTS, machine, now, versions  # noqa: E402
from expected_state.store import ExpectedStateStore  # noqa: E402
from reconcile.core.contract import SinkTxnId, WriterIdentity  # noqa: E402
from reconcile.recovery import recover  # noqa: E402
from sinks.iceberg.sink import IcebergSink  # noqa: E402

SMALL = pa.schema([("k", pa.int64()), ("v", pa.int64())])
BIG = pa.schema([("id", pa.int64()), ("name", pa.string()), ("qty", pa.int32()),
                 ("price", pa.float64())])  # fmt: skip


def catalog(root: Path) -> str:
    return (
        f"iceberg://bench?type=sql&uri=sqlite:///{root}/catalog.db"
        f"&warehouse=file://{root}/warehouse&namespace=bench"
    )


def one_epoch(sink: IcebergSink, epoch: int, rows: Any) -> float:
    """Seconds of prepare + commit of one epoch (staging is in memory)."""
    txn = SinkTxnId("bench", sink.name, epoch, 1)
    assert sink.stage(txn, rows)
    start = time.perf_counter()
    prepared = sink.prepare(txn)
    committed = sink.commit(txn)
    took = time.perf_counter() - start
    if not (prepared and committed):
        raise RuntimeError(f"epoch {epoch}: prepare {prepared!r}, commit {committed!r}")
    return took


def big_table(rows: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table(
        {
            "id": np.arange(rows, dtype=np.int64),
            "name": pa.array([f"customer-{i % 100_000:06d}" for i in range(rows)]),
            "qty": pa.array(rng.integers(1, 50, rows, dtype=np.int32)),
            "price": pa.array(rng.random(rows) * 1000),
        },
        schema=BIG,
    )


def upserts(table: pa.Table) -> pa.Table:
    """The store's form of a table of upserts: an ``_op`` column."""
    return table.append_column("_op", pa.array(["upsert"] * table.num_rows))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--small-epochs", type=int, default=300, help="100-row epochs")
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows per big epoch")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="reconcile-bench-iceberg-"))
    uri = catalog(root)
    writer = WriterIdentity("bench", "bench-log")

    small = IcebergSink("small", f"{uri}&key=k", schema=SMALL)
    small.bind(writer)
    small_ms = []
    for epoch in range(args.small_epochs):
        again = [{"k": (epoch - 1) * 90 + i, "v": epoch} for i in range(10)] if epoch else []
        new = [{"k": epoch * 90 + i, "v": epoch} for i in range(100 - len(again))]
        small_ms.append(one_epoch(small, epoch, again + new) * 1000)
        if epoch % 50 == 0:
            print(f"small epoch {epoch}: {small_ms[-1]:.1f} ms", flush=True)
    warm = small_ms[max(1, args.small_epochs // 10) :]
    quantiles = statistics.quantiles(warm, n=20)

    big = IcebergSink("big", f"{uri}&key=id", schema=BIG)
    big.bind(writer)
    store = ExpectedStateStore(str(root / "expected"), "bench", "big", ["id"], schema=BIG)
    first, second = big_table(args.rows, 1), big_table(args.rows, 2)
    append_s = one_epoch(big, 0, first)
    store.apply(0, upserts(first))
    upsert_s = one_epoch(big, 1, second)
    store.apply(1, upserts(second))
    print(f"big epochs: append {append_s:.2f} s, upsert {upsert_s:.2f} s", flush=True)
    start = time.perf_counter()
    verified = recover(f"{uri}&key=id", str(root / "expected"), "bench", "big", mode="full",
                       dry_run=True)  # fmt: skip
    verify_s = time.perf_counter() - start
    if verified.drift or verified.rows_pulled != args.rows:
        raise RuntimeError(f"the verify found {verified}")

    part: dict[str, Any] = {
        "measured_at": now(),
        "catalog": "pyiceberg SQL catalog on a SQLite file, local warehouse folder",
        "small_epoch_commit_ms": {
            "rows_per_epoch": 100,
            "epochs": args.small_epochs,
            "p50": round(statistics.median(warm), 2),
            "p95": round(quantiles[18], 2),
            "what": "prepare + commit of one epoch (90 new keys, 10 upserted again)",
        },
        "big_epoch_rows_per_s": {
            "rows": args.rows,
            "append": round(args.rows / append_s),
            "upsert_every_row": round(args.rows / upsert_s),
            "what": "prepare + commit of one epoch staged as one Arrow table",
        },
        "full_verify_rows_per_s": {
            "rows": args.rows,
            "value": round(args.rows / verify_s),
            "seconds": round(verify_s, 2),
        },
        # Other work on the machine slows every figure: its load average, as the run ended.
        "machine": machine(load_average_1_5_15_min=[round(x, 2) for x in os.getloadavg()]),
        "versions": versions("pyiceberg", "pyarrow", "deltalake"),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "sinks.json"
    report = json.loads(path.read_text()) if path.exists() else {}
    report["iceberg"] = part
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(part, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
