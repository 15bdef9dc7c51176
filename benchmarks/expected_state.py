"""Benchmark of the expected-state store (merge-on-read) beside the copy-on-write store it replaced.

Measures, in one run on the same data: small epochs (100 rows, half updates of
existing keys) on a 10M-row table, p50/p95 over many epochs, for both stores;
the epochs table as the progress log (mark, mark_many); reading a 10M-row
snapshot; compaction; one big epoch. Writes JSON and Markdown.

The copy-on-write store is loaded from git (``--baseline-ref``, the commit before
merge-on-read) into a temporary package, so the comparison runs the old code
unchanged.

Run: ``.venv/bin/python -m benchmarks.expected_state [--scale 1.0]``
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from deltalake import DeltaTable

from expected_state.progress_log import StoreProgressLog
from expected_state.store import ExpectedStateStore
from reconcile.core.progress import EpochStatus
from reconcile.engine.progress_file import FileProgressLog

RESULTS = Path(__file__).resolve().parent / "results"
REPO = Path(__file__).resolve().parents[1]
BASELINE_REF = "729caa4"  # the last commit of the copy-on-write store
_OLD_MODULES = ("changes", "delta_commit", "delta_files", "epochs", "fencing", "housekeeping",
                "store")  # fmt: skip


def keys(numbers: np.ndarray) -> pa.Array:
    return pa.array(np.char.add("k", np.char.zfill(numbers.astype(str), 10)))


def batch(numbers: np.ndarray, seed: int) -> pa.Table:
    values = np.random.default_rng(seed).integers(0, 1 << 40, len(numbers))
    return pa.table({"k": keys(numbers), "v": values, "_op": ["upsert"] * len(numbers)})


def summary(values_ms: list[float]) -> dict[str, float]:
    if not values_ms:
        return {"p50_ms": 0.0, "p95_ms": 0.0, "max_ms": 0.0, "epochs": 0}
    ordered = sorted(values_ms)
    return {
        "p50_ms": round(statistics.median(ordered), 2),
        "p95_ms": round(ordered[int(0.95 * (len(ordered) - 1))], 2),
        "max_ms": round(ordered[-1], 2),
        "epochs": len(ordered),
    }


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def small_batches(base_rows: int, epochs: int, size: int) -> list[pa.Table]:
    """``epochs`` batches of ``size`` rows: half updates of existing keys, half new keys."""
    rng = np.random.default_rng(3)
    out, next_key = [], base_rows
    for e in range(epochs):
        old = rng.choice(base_rows, size // 2, replace=False)
        new = np.arange(next_key, next_key + size - size // 2)
        next_key += len(new)
        out.append(batch(np.concatenate([old, new]), seed=1000 + e))
    return out


def load_baseline(ref: str, into: Path) -> Any:
    """The copy-on-write ``ExpectedStateStore`` class, as of git ``ref``."""
    package = into / "cow_expected_state"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    for name in _OLD_MODULES:
        source = subprocess.run(
            ["git", "-C", str(REPO), "show", f"{ref}:expected_state/{name}.py"],
            check=True, capture_output=True, text=True,
        ).stdout  # fmt: skip
        source = re.sub(r"\bexpected_state\.", "cow_expected_state.", source)
        (package / f"{name}.py").write_text(source)
    sys.path.insert(0, str(into))
    return importlib.import_module("cow_expected_state.store").ExpectedStateStore


def build(store: Any, base_rows: int, epochs: int) -> float:
    """Fill ``store`` with ``base_rows`` keys in ``epochs`` epochs, then compact it."""
    per = base_rows // epochs
    t0 = time.perf_counter()
    for e in range(epochs):
        store.apply(e + 1, batch(np.arange(e * per, (e + 1) * per), seed=e))
    return time.perf_counter() - t0


def run_small(
    store: Any, batches: list[pa.Table], first_epoch: int, *, maintain: bool = False
) -> dict[str, Any]:
    """Apply ``batches`` as consecutive epochs; wall and CPU time of each ``apply()``.

    With ``maintain``, ``store.maintain()`` runs after every epoch, as the commit
    cycle would run it, off the timed path; what it did is timed apart.
    """
    wall, cpu, checkpoints, merges = [], [], [], []
    for i, data in enumerate(batches):
        gc.collect()
        gc.disable()  # a collection inside one apply() would be charged to that epoch
        try:
            c0, t0 = time.process_time(), time.perf_counter()
            store.apply(first_epoch + i, data)
            wall.append((time.perf_counter() - t0) * 1000)
            cpu.append((time.process_time() - c0) * 1000)
        finally:
            gc.enable()
        if maintain:
            done, s = timed(store.maintain)
            if "compact_changes" in done:
                merges.append(s * 1000)
            elif done:
                checkpoints.append(s * 1000)
    out: dict[str, Any] = {"wall": summary(wall), "cpu": summary(cpu)}
    quarter = max(1, len(wall) // 4)
    out["first_quarter"], out["last_quarter"] = summary(wall[:quarter]), summary(wall[-quarter:])
    if maintain:
        out["maintain_checkpoint"] = summary(checkpoints)
        out["maintain_merge_vacuum_checkpoint"] = summary(merges)
    return out


def bench_stores(
    root: Path, base_rows: int, epochs: int, baseline_epochs: int, ref: str
) -> dict[str, Any]:
    """Both stores on the same 10M-row table and the same small epochs."""
    batches = small_batches(base_rows, 2 * epochs, 100)
    mor = ExpectedStateStore(str(root / "mor"), "bench", "t", ["k"])
    build_s = build(mor, base_rows, 10)
    _, fold_build_s = timed(lambda: mor.compact(through_epoch=mor.last_epoch()))
    # Phase 1: no housekeeping at all: change files and log entries pile up, and
    # no checkpoint is written but delta-rs' own every 100 versions.
    piled = run_small(mor, batches[:epochs], 11)
    _, merge_s = timed(mor.compact_changes)
    _, vacuum_s = timed(
        lambda: mor.vacuum(keep_epochs=10, retention_hours=0, safety_margin_minutes=0)
    )
    # Phase 2: maintain() between epochs (off the timed path), as a pipeline runs it.
    mor.maintain()
    steady = run_small(mor, batches[epochs:], 11 + epochs, maintain=True)
    last = mor.last_epoch()
    reader = ExpectedStateStore(str(root / "mor"), "bench", "t", ["k"])
    snap, read_s = timed(reader.snapshot)
    # Within what maintain() keeps (it vacuums all but the newest epochs).
    _, travel_s = timed(lambda: reader.snapshot(last - 5))
    _, keys_s = timed(lambda: reader.changed_keys(last - 10))
    tail = len([u for u in DeltaTable(reader.uri).file_uris() if "change-" in u])
    fold, fold_s = timed(mor.compact)
    merge_on_read = {
        "no_housekeeping": piled,
        "with_housekeeping": steady,
        "build_s": round(build_s, 2),
        "compact_fold_10_epochs_s": round(fold_build_s, 2),
        "compact_changes_of_phase_1_s": round(merge_s, 3),
        "vacuum_after_phase_1_s": round(vacuum_s, 3),
        "snapshot_rows": snap.num_rows,
        "snapshot_change_files": tail,
        "snapshot_read_s": round(read_s, 3),
        "time_travel_read_s": round(travel_s, 3),
        "changed_keys_last_10_epochs_s": round(keys_s, 4),
        "compact_fold_tail_s": round(fold_s, 2),
        "compact_fold_tail_epochs": fold["folded_epochs"],
    }
    del snap
    shutil.rmtree(root / "mor", ignore_errors=True)
    gc.collect()
    cow_class = load_baseline(ref, root / "baseline")
    cow = cow_class(str(root / "cow"), "bench", "t", ["k"])
    cow_build_s = build(cow, base_rows, 10)
    _, cow_compact_s = timed(cow.compact)
    cow_run = run_small(cow, batches[:baseline_epochs], 11)
    copy_on_write = {
        "no_housekeeping": cow_run,
        "build_s": round(cow_build_s, 2),
        "compact_s": round(cow_compact_s, 2),
        "ref": ref,
    }
    shutil.rmtree(root / "cow", ignore_errors=True)
    return {"base_rows": base_rows, "rows_per_epoch": 100, "merge_on_read": merge_on_read,
            "copy_on_write": copy_on_write}  # fmt: skip


def bench_marks(root: Path, epochs: int) -> dict[str, Any]:
    """The progress log's cost per epoch: D, C, F as three marks; as one mark_many; the file log."""
    d, c, f = EpochStatus.DECIDED, EpochStatus.COMMITTED, EpochStatus.FINALIZED
    log = StoreProgressLog(str(root / "marks"), "bench")
    gen = log.claim_generation()
    single, per_epoch = [], []
    for e in range(epochs):
        t0 = time.perf_counter()
        for status in (d, c, f):
            _, s = timed(lambda st=status, ep=e: log.mark(ep, st, gen))  # type: ignore[misc]
            single.append(s * 1000)
        per_epoch.append((time.perf_counter() - t0) * 1000)
    many = StoreProgressLog(str(root / "many"), "bench")
    gen = many.claim_generation()
    batched = []
    for e in range(epochs):
        moves = [(e, d), (e, c)] + ([(e - 1, f)] if e else [])
        _, s = timed(lambda m=moves: many.mark_many(m, gen))  # type: ignore[misc]
        batched.append(s * 1000)
    file_log = FileProgressLog(root / "file", "bench")
    gen = file_log.claim_generation()
    file_marks = []
    for e in range(epochs):
        for status in (d, c, f):
            _, s = timed(lambda st=status, ep=e: file_log.mark(ep, st, gen))  # type: ignore[misc]
            file_marks.append(s * 1000)
    return {
        "epochs": epochs,
        "store_mark": summary(single),
        "store_three_marks_per_epoch": summary(per_epoch),
        "store_mark_many_per_epoch": summary(batched),
        "file_mark": summary(file_marks),
    }


def bench_big_epoch(root: Path, rows: int) -> dict[str, Any]:
    store = ExpectedStateStore(str(root / "big"), "bench", "big", ["k"])
    _, insert_s = timed(lambda: store.apply(1, batch(np.arange(rows), seed=1)))
    _, update_s = timed(lambda: store.apply(2, batch(np.arange(rows), seed=2)))
    _, read_s = timed(store.snapshot)
    return {"rows": rows, "insert_s": round(insert_s, 3), "update_s": round(update_s, 3),
            "snapshot_of_two_overlapping_epochs_s": round(read_s, 3)}  # fmt: skip


def versions() -> dict[str, str]:
    import deltalake

    return {"python": platform.python_version(), "deltalake": deltalake.__version__,
            "pyarrow": pa.__version__, "numpy": np.__version__}  # fmt: skip


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


def markdown(r: dict[str, Any]) -> str:
    s = r["stores"]
    mor, cow = s["merge_on_read"], s["copy_on_write"]
    piled, steady = mor["no_housekeeping"], mor["with_housekeeping"]
    m, b = r["marks"], r["big_epoch"]

    def ms(x: dict[str, float]) -> str:
        return f"p50 {x['p50_ms']} ms, p95 {x['p95_ms']} ms, max {x['max_ms']} ms ({x['epochs']})"

    rows = f"{s['base_rows']:,}"
    table = [
        ("**small epoch, merge-on-read, `maintain()` between epochs** (target p95 <= 20 ms)",
         f"100 rows (50 updates) on {rows}", ms(steady["wall"])),
        ("same, CPU time of the process (all threads)", "", ms(steady["cpu"])),
        ("small epoch, merge-on-read, no housekeeping", f"{piled['wall']['epochs']} epochs, "
         "change files and log piling up", ms(piled["wall"])),
        ("same, p95 of the first / last quarter", "",
         f"{piled['first_quarter']['p95_ms']} / {piled['last_quarter']['p95_ms']} ms"),
        ("small epoch, copy-on-write (the store before)", "same table, same first epochs",
         ms(cow["no_housekeeping"]["wall"])),
        ("`maintain()` that wrote a checkpoint (every 10 commits)", "off the write path",
         ms(steady["maintain_checkpoint"])),
        ("`maintain()` that merged, vacuumed and wrote a checkpoint (every 50 epochs)",
         "off the write path", ms(steady["maintain_merge_vacuum_checkpoint"])),
        ("read the newest snapshot", f"{mor['snapshot_rows']:,} rows: base + "
         f"{mor['snapshot_change_files']} change files", f"{mor['snapshot_read_s']} s"),
        ("read a time-travelled snapshot", "5 epochs back", f"{mor['time_travel_read_s']} s"),
        ("changed_keys of the last 10 epochs", "", f"{mor['changed_keys_last_10_epochs_s']} s"),
        ("compact: fold 10 epochs of new keys into the base", f"{rows} rows",
         f"{mor['compact_fold_10_epochs_s']} s"),
        ("compact: fold the small epochs into the base",
         f"{rows} rows, {mor['compact_fold_tail_epochs']} epochs",
         f"{mor['compact_fold_tail_s']} s"),
        ("progress log, one mark", f"{m['epochs']} epochs x 3 marks", ms(m["store_mark"])),
        ("progress log, DECIDED + COMMITTED + FINALIZED as three marks", "per epoch",
         ms(m["store_three_marks_per_epoch"])),
        ("progress log, one mark_many (D, C of e; F of e-1)", "per epoch",
         ms(m["store_mark_many_per_epoch"])),
        ("file progress log, one mark (reference)", "", ms(m["file_mark"])),
        ("one big epoch, new keys / every key updated", f"{b['rows']:,} rows",
         f"{b['insert_s']} s / {b['update_s']} s"),
    ]  # fmt: skip
    machine = r["machine"]
    lines = [
        "# Expected-state store benchmark",
        "",
        f"Run {r['run_at']} on {machine['cpus']} CPUs shared with other work (load average at "
        f"start {machine['load_average_at_start']}), {machine['memory_gib']} GiB; deltalake "
        f"{r['versions']['deltalake']}, pyarrow {r['versions']['pyarrow']}. Local disk, "
        f"Delta tables via delta-rs. Command: `{r['command']}`.",
        "",
        "| measurement | scale | result |",
        "|---|---|---|",
        *(f"| {a} | {b} | {c} |" for a, b, c in table),
        "",
        "Small epochs: each is 100 rows, 50 of them updates of random existing keys and 50 new "
        "keys, timed around `apply()` (normalize, hash, one Parquet file fsynced, one Delta "
        "commit fsynced); the process's CPU time is measured too, since the machine is shared. "
        "Both stores start from the same keys (10 epochs of 1M, then compacted into one base) "
        "and get the same batches; the copy-on-write store runs only the first "
        f"{cow['no_housekeeping']['wall']['epochs']}, since each rewrites the files holding the "
        "keys it updates. The merge-on-read store first runs with no housekeeping at all (its "
        "change files and its log pile up, and delta-rs writes a checkpoint only every 100 "
        "versions), then with `maintain()` after every epoch, outside the timed `apply()` "
        "calls, as a pipeline runs it: a checkpoint every 10 commits, and `compact_changes()` "
        "plus `vacuum()` once 50 epochs have files of their own. Folding the changes into the "
        "base (`compact()`) is timed on its own.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of the full scale")
    parser.add_argument("--epochs", type=int, default=400, help="small epochs, merge-on-read")
    parser.add_argument("--baseline-epochs", type=int, default=8, help="small epochs, before")
    parser.add_argument("--baseline-ref", default=BASELINE_REF)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench_expected_state_"))
    load = [round(x, 2) for x in os.getloadavg()]
    try:
        marks = bench_marks(root, 200)
        big = bench_big_epoch(root, int(1_000_000 * args.scale))
        stores = bench_stores(
            root, int(10_000_000 * args.scale), args.epochs, args.baseline_epochs, args.baseline_ref
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    mor = stores["merge_on_read"]["with_housekeeping"]["wall"]
    cow = stores["copy_on_write"]["no_housekeeping"]["wall"]
    result = {
        "small_epoch_p95_ms": mor["p95_ms"],
        "small_epoch_p50_ms": mor["p50_ms"],
        "copy_on_write_small_epoch_p50_ms": cow["p50_ms"],
        "copy_on_write_small_epoch_p95_ms": cow["p95_ms"],
        "stores": stores,
        "marks": marks,
        "big_epoch": big,
        "scale": {"factor": args.scale, "base_rows": stores["base_rows"], "small_epoch_rows": 100},
        "machine": {**machine(), "load_average_at_start": load},
        "versions": versions(),
        "run_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": f"python -m benchmarks.expected_state --scale {args.scale} "
        f"--epochs {args.epochs} --baseline-epochs {args.baseline_epochs}",
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "expected_state.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / "expected_state.md").write_text(markdown(result))
    print(json.dumps({k: result[k] for k in list(result)[:4]}, indent=2))


if __name__ == "__main__":
    main()
