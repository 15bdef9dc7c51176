"""What the store day's RSS is made of: the day's loop, sampled, at a reduced number of epochs.

``python -m benchmarks.scale.rss_probe --epochs 20000 --every 500 --out probe.jsonl``
runs the loop of ``bench_store_day`` (epochs of 100 rows, ``maintain()`` after
each) and, every ``--every`` epochs, writes one JSON line of what the process
holds: RSS split into anonymous and file-backed pages, glibc's heap
(``mallinfo2``: bytes in use, bytes free in its arenas, mmapped chunks), Arrow's
pool (bytes allocated, its backend), the store table's live files and log
entries, the DeltaTable objects alive, and the sizes of the store's own caches.

``--workload same`` updates 100 of the first 100,000 keys each epoch, so that
the table does not grow: what still grows with epochs there is not the table.
``--merge-max-rows`` is passed to ``maintain()``. ``--tracemalloc A`` diffs
Python's allocations between epoch ``A`` and the end.
The glibc and Arrow knobs are environment variables, set by the caller
(``MALLOC_ARENA_MAX``, ``ARROW_DEFAULT_MEMORY_POOL``).
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import gc
import json
import os
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.expected_state import batch  # noqa: E402
from benchmarks.scale.day import DAY_MARGIN_EPOCHS  # noqa: E402
from expected_state.compaction import DEFAULT_MERGE_MAX_ROWS  # noqa: E402
from expected_state.live import live_files  # noqa: E402
from expected_state.store import ExpectedStateStore  # noqa: E402

_MALLINFO2 = "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost"


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in _MALLINFO2.split()]


def _mallinfo() -> dict[str, float]:
    """glibc's heap, over all arenas, in MB (empty where there is no ``mallinfo2``)."""
    name = ctypes.util.find_library("c")
    fn = getattr(ctypes.CDLL(name), "mallinfo2", None) if name else None
    if fn is None:
        return {}
    fn.restype = _MallInfo2
    info = fn()
    return {
        "heap_mb": round(info.arena / 2**20, 1),  # sbrk'd and arena-mmapped
        "heap_used_mb": round(info.uordblks / 2**20, 1),
        "heap_free_mb": round(info.fordblks / 2**20, 1),
        "mmapped_mb": round(info.hblkhd / 2**20, 1),  # big chunks mmapped one by one
    }


def _status() -> dict[str, float]:
    wanted = {"VmRSS": "rss_mb", "RssAnon": "anon_mb", "RssFile": "file_mb", "VmHWM": "hwm_mb"}
    out = {}
    with open("/proc/self/status") as status:
        for line in status:
            key = line.split(":")[0]
            if key in wanted:
                out[wanted[key]] = round(int(line.split()[1]) / 1024, 1)
    return out


def _sizes(store: ExpectedStateStore) -> dict[str, int]:
    """The length of each container the store (and its epochs log, its audit) holds."""
    sizes: dict[str, int] = {}
    audit = getattr(store, "_log_audit", None)
    for prefix, obj in (("", store), ("epochs.", store.epochs), ("audit.", audit)):
        if obj is None:
            continue
        for name, value in vars(obj).items():
            if isinstance(value, dict | list | set | tuple | frozenset):
                sizes[prefix + name] = len(value)
    table = store._table
    memo = getattr(table, "_reconcile_transaction_versions", None)
    sizes["txn_memo"] = len(memo) if memo is not None else 0
    return sizes


def sample(store: ExpectedStateStore, root: Path, epoch: int, rows: int) -> dict[str, Any]:
    table = store._delta()
    assert table is not None
    kinds: dict[str, int] = {}
    for obj in gc.get_objects():
        kind = type(obj).__name__
        if kind in ("DeltaTable", "RawDeltaTable"):
            kinds[kind] = kinds.get(kind, 0) + 1
    pool = pa.default_memory_pool()
    log = root / "bench" / "t" / "_delta_log"
    return {
        "epoch": epoch,
        "rows": rows,
        **_status(),
        **_mallinfo(),
        "arrow_mb": round(pa.total_allocated_bytes() / 2**20, 1),
        "pool_mb": round(pool.bytes_allocated() / 2**20, 1),
        "pool": pool.backend_name,
        "live_files": len(live_files(table, name=store.uri)),
        "version": table.version(),
        "log_entries": sum(1 for p in log.iterdir() if p.name[0].isdigit()),
        "delta_objects": kinds,
        "py_objects": len(gc.get_objects()),
        "threads": len(os.listdir("/proc/self/task")),
        "caches": _sizes(store),
        "t": round(time.perf_counter(), 1),
    }


def run(args: argparse.Namespace) -> None:
    root = Path(tempfile.mkdtemp(prefix="reconcile-rss-probe-", dir=args.workdir))
    store = ExpectedStateStore(str(root), "bench", "t", ["k"])
    store.apply(0, batch(np.arange(100_000), seed=0))
    rng = np.random.default_rng(3)
    next_key, rows = 100_000, 100_000
    out = open(args.out, "w")  # noqa: SIM115
    snapshot = None

    def write(line: dict[str, Any]) -> None:
        out.write(json.dumps(line) + "\n")
        out.flush()

    write(sample(store, root, 0, rows))
    started = time.perf_counter()
    for e in range(1, args.epochs + 1):
        if args.workload == "same":
            numbers = rng.choice(100_000, 100, replace=False)
        else:
            old = rng.choice(next_key, 50, replace=False)
            numbers = np.concatenate([old, np.arange(next_key, next_key + 50)])
            next_key += 50
            rows += 50
        t0 = time.perf_counter()
        store.apply(e, batch(numbers, seed=e))
        pace_s = (t0 - started) / max(1, e - 1) if e > 1 else 0.0
        store.maintain(
            keep_from_epoch=e - 1,
            safety_margin_minutes=DAY_MARGIN_EPOCHS * pace_s / 60,
            merge_max_rows=args.merge_max_rows,
        )
        if args.tracemalloc and e == args.tracemalloc:
            gc.collect()
            snapshot = tracemalloc.take_snapshot()
        if e % args.every == 0 or e == args.epochs:
            write(sample(store, root, e, rows))
    if snapshot is not None:
        gc.collect()
        diff = tracemalloc.take_snapshot().compare_to(snapshot, "lineno")
        for stat in diff[:25]:
            write({"tracemalloc": str(stat)})
        write({"tracemalloc_total_mb": round(tracemalloc.get_traced_memory()[0] / 2**20, 2)})
    out.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=20_000)
    parser.add_argument("--every", type=int, default=500)
    parser.add_argument("--workload", choices=["grow", "same"], default="grow")
    parser.add_argument("--merge-max-rows", type=int, default=DEFAULT_MERGE_MAX_ROWS)
    parser.add_argument("--tracemalloc", type=int, default=0, help="diff from this epoch on")
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    if args.tracemalloc:
        tracemalloc.start(1)
    run(args)


if __name__ == "__main__":
    main()
