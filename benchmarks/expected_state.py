"""Benchmark of the expected-state store: apply, snapshot, small-epoch overhead (JSON + Markdown).

Run: ``.venv/bin/python -m benchmarks.expected_state [--scale 1.0]``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from expected_state.store import ExpectedStateStore
from reconcile.hashing import row_hash_arrow

RESULTS = Path(__file__).resolve().parent / "results"
HASHING_JSON = RESULTS / "hashing.json"


def changes(start: int, count: int, op: str = "upsert", seed: int = 0) -> pa.Table:
    """``count`` rows with keys k<start>..k<start+count-1> (zero-padded) and an int value."""
    keys = np.char.add("k", np.char.zfill(np.arange(start, start + count).astype(str), 10))
    values = np.random.default_rng(seed).integers(0, 1 << 40, count)
    return pa.table({"k": pa.array(keys), "v": pa.array(values), "_op": [op] * count})


def timed(fn: Any) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def bench_apply(root: Path, rows: int) -> dict[str, Any]:
    """One epoch of ``rows`` new keys, then one epoch updating all of them."""
    store = ExpectedStateStore(str(root / "apply"), "bench", "apply", ["k"])
    data = changes(0, rows)
    _, insert_s = timed(lambda: store.apply(1, data))
    data = changes(0, rows, seed=1)
    _, update_s = timed(lambda: store.apply(2, data))
    return {
        "rows": rows,
        "insert_s": round(insert_s, 3),
        "insert_rows_per_s": round(rows / insert_s),
        "update_s": round(update_s, 3),
        "update_rows_per_s": round(rows / update_s),
    }


def bench_snapshot(root: Path, rows: int, epochs: int) -> dict[str, Any]:
    """Build ``rows`` rows in ``epochs`` insert epochs, then read the newest snapshot."""
    store = ExpectedStateStore(str(root / "snapshot"), "bench", "snap", ["k"])
    per = rows // epochs
    build_t0 = time.perf_counter()
    for e in range(epochs):
        store.apply(e + 1, changes(e * per, per))
    build_s = time.perf_counter() - build_t0
    reader = ExpectedStateStore(str(root / "snapshot"), "bench", "snap", ["k"])
    table, read_s = timed(reader.snapshot)
    _, old_s = timed(lambda: reader.snapshot(epochs // 2))
    assert table.num_rows == per * epochs
    return {
        "rows": table.num_rows,
        "build_epochs": epochs,
        "build_s": round(build_s, 2),
        "read_s": round(read_s, 3),
        "read_rows_per_s": round(table.num_rows / read_s),
        "time_travel_read_s": round(old_s, 3),
    }


def bench_small_epochs(root: Path, base_rows: int, epochs: int, size: int) -> dict[str, Any]:
    """Wall time of apply() for ``epochs`` epochs of ``size`` rows on a ``base_rows`` table.

    Inserts: new keys (min/max pruning skips every existing file). Updates:
    half of each epoch rewrites existing keys spread over the table.
    """
    store = ExpectedStateStore(str(root / "small"), "bench", "small", ["k"])
    store.apply(1, changes(0, base_rows))
    store.compact()
    insert_ms = []
    next_key = base_rows
    for e in range(2, 2 + epochs):
        batch = changes(next_key, size, seed=e)
        next_key += size
        _, s = timed(lambda b=batch, ep=e: store.apply(ep, b))  # type: ignore[misc]
        insert_ms.append(s * 1000)
    rng = np.random.default_rng(3)
    update_ms = []
    for e in range(2 + epochs, 2 + epochs + epochs // 4):
        old = rng.choice(base_rows, size // 2, replace=False)
        keys = np.concatenate(
            [
                np.char.add("k", np.char.zfill(old.astype(str), 10)),
                np.char.add(
                    "k", np.char.zfill(np.arange(next_key, next_key + size // 2).astype(str), 10)
                ),
            ]
        )
        next_key += size // 2
        batch = pa.table({"k": keys, "v": np.arange(size), "_op": ["upsert"] * size})
        _, s = timed(lambda b=batch, ep=e: store.apply(ep, b))  # type: ignore[misc]
        update_ms.append(s * 1000)

    def summary(values: list[float]) -> dict[str, float]:
        ordered = sorted(values)
        return {
            "median_ms": round(statistics.median(ordered), 2),
            "p95_ms": round(ordered[int(0.95 * (len(ordered) - 1))], 2),
            "max_ms": round(ordered[-1], 2),
            "epochs": len(ordered),
        }

    return {
        "base_rows": base_rows,
        "rows_per_epoch": size,
        "insert": summary(insert_ms),
        "update_half": summary(update_ms),
    }


def hash_figures(rows: int) -> dict[str, Any]:
    """Take the hash figures from the hash benchmark's JSON, running it if needed."""
    script = Path(__file__).resolve().parent / "hashing.py"
    if not HASHING_JSON.exists() and script.exists():
        subprocess.run([sys.executable, "-m", "benchmarks.hashing"], check=False, timeout=1800)
    if HASHING_JSON.exists():
        data = json.loads(HASHING_JSON.read_text())
        return {
            "hash_python_rows_per_s": data.get("hash_python_rows_per_s"),
            "hash_spark_rows_per_s": data.get("hash_spark_rows_per_s"),
            "source": str(HASHING_JSON.relative_to(RESULTS.parent.parent)),
        }
    # No hash benchmark yet: measure the Python hash here; Spark is not measured.
    table = changes(0, rows).drop_columns(["_op"])
    _, s = timed(lambda: row_hash_arrow(table))
    return {
        "hash_python_rows_per_s": round(rows / s),
        "hash_spark_rows_per_s": None,
        "source": f"measured here (row_hash_arrow, {rows} rows of string+int64); Spark not run",
    }


def versions() -> dict[str, str]:
    import deltalake
    import pyspark

    return {
        "python": platform.python_version(),
        "deltalake": deltalake.__version__,
        "pyarrow": pa.__version__,
        "numpy": np.__version__,
        "pyspark": pyspark.__version__,
    }


def machine() -> dict[str, Any]:
    memory_gib = None
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                memory_gib = round(int(line.split()[1]) / 2**20, 1)
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "memory_gib": memory_gib,
    }


def markdown(result: dict[str, Any]) -> str:
    a, s, e = result["apply"], result["snapshot"], result["small_epochs"]
    return "\n".join(
        [
            "# Expected-state store benchmark",
            "",
            f"Run {result['run_at']} on {result['machine']['cpus']} CPUs, "
            f"{result['machine']['memory_gib']} GiB; deltalake {result['versions']['deltalake']}, "
            f"pyarrow {result['versions']['pyarrow']}. Local disk, Delta tables via delta-rs. "
            f"Command: `{result['command']}`.",
            "",
            "| measurement | scale | result |",
            "|---|---|---|",
            f"| apply one epoch of new keys | {a['rows']:,} rows | "
            f"{a['insert_rows_per_s']:,} rows/s ({a['insert_s']} s) |",
            f"| apply one epoch updating every key | {a['rows']:,} rows | "
            f"{a['update_rows_per_s']:,} rows/s ({a['update_s']} s) |",
            f"| read the newest snapshot | {s['rows']:,} rows, {s['build_epochs']} epochs | "
            f"{s['read_rows_per_s']:,} rows/s ({s['read_s']} s) |",
            f"| read a time-travelled snapshot | epoch {s['build_epochs'] // 2} | "
            f"{s['time_travel_read_s']} s |",
            f"| small epoch, new keys (target <= 20 ms) | {e['rows_per_epoch']} rows on "
            f"{e['base_rows']:,} | median {e['insert']['median_ms']} ms, "
            f"p95 {e['insert']['p95_ms']} ms |",
            f"| small epoch, half updates of existing keys | {e['rows_per_epoch']} rows on "
            f"{e['base_rows']:,} | median {e['update_half']['median_ms']} ms, "
            f"p95 {e['update_half']['p95_ms']} ms |",
            f"| row hash, Python | | {result['hash_python_rows_per_s']} rows/s |",
            f"| row hash, Spark | | {result['hash_spark_rows_per_s']} rows/s |",
            "",
            "`small_epoch_overhead_ms` is the median wall time of `apply()` for a 100-row epoch "
            "of new keys: the one Delta commit (log write, conflict check, refresh), the "
            "Parquet write with fsync, hashing, and pruning the live files by key. "
            "An epoch that updates existing keys also rewrites every file holding one of "
            "them (copy-on-write); here the "
            "100k base rows sit in one compacted file, which every such epoch rewrites, so "
            "its cost grows with the size of the files it touches.",
            f"Hash figures: {result['hash_source']}.",
            "",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of the full scale")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    scale = args.scale
    root = Path(tempfile.mkdtemp(prefix="bench_expected_state_"))
    try:
        apply = bench_apply(root, int(1_000_000 * scale))
        snapshot = bench_snapshot(root, int(10_000_000 * scale), 10)
        small = bench_small_epochs(root, int(100_000 * scale), max(20, int(200 * scale)), 100)
        hashes = hash_figures(int(10_000_000 * scale))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    result = {
        "small_epoch_overhead_ms": small["insert"]["median_ms"],
        "hash_python_rows_per_s": hashes["hash_python_rows_per_s"],
        "hash_spark_rows_per_s": hashes["hash_spark_rows_per_s"],
        "hash_source": hashes["source"],
        "apply": apply,
        "snapshot": snapshot,
        "small_epochs": small,
        "scale": {
            "factor": scale,
            "apply_rows": apply["rows"],
            "snapshot_rows": snapshot["rows"],
            "small_epoch_rows": 100,
        },
        "machine": machine(),
        "versions": versions(),
        "run_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": f"python -m benchmarks.expected_state --scale {scale}",
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "expected_state.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / "expected_state.md").write_text(markdown(result))
    print(json.dumps({k: result[k] for k in list(result)[:4]}, indent=2))


if __name__ == "__main__":
    main()
