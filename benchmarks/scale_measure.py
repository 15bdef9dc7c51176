"""One measurement of the scale benchmark, alone in a fresh process: its time and its peak RSS.

``benchmarks/scale.py`` runs each verify as ``python -m benchmarks.scale_measure
ACTION ...`` so that the peak resident memory it reports (``VmHWM`` of this
process) is the action's own, not the loader's or an earlier action's. Prints
one JSON object on its last line.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _copy_out(dsn: str, table: str) -> dict[str, Any]:
    """A binary COPY of the whole table, read and dropped: the floor a verify is held to."""
    import psycopg
    from psycopg import sql

    size = 0
    with psycopg.connect(dsn) as conn, conn.cursor() as cur:
        query = sql.SQL("COPY {} TO STDOUT (FORMAT BINARY)").format(sql.Identifier(table))
        with cur.copy(query) as copy:
            for block in copy:
                size += len(block)
    return {"bytes": size}


def _verify(args: argparse.Namespace) -> dict[str, Any]:
    from reconcile import recover

    report = recover(
        args.dsn, args.store, args.pipeline, args.table, mode=args.mode, dry_run=True,
        chunk_rows=args.chunk_rows, spill_dir=args.spill_dir,
    )  # fmt: skip
    return {
        "mode": report.mode,
        "rows_pulled": report.rows_pulled,
        "missing": report.missing,
        "extra": report.extra,
        "changed": report.changed,
        "buckets_compared": report.buckets_compared,
    }


def _peak_rss_kib() -> int:
    """This process's peak resident memory (VmHWM), in KiB.

    Not ``ru_maxrss``: Linux carries the parent's high-water mark into it
    across ``exec``, so a process started by a large parent reports that size.
    """
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("action", choices=["copy", "verify"])
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--table", required=True)
    parser.add_argument("--store", default="")
    parser.add_argument("--pipeline", default="bench")
    parser.add_argument("--mode", default="full")
    parser.add_argument("--chunk-rows", type=int, default=1_000_000)
    parser.add_argument("--spill-dir", default=None)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    out = _copy_out(args.dsn, args.table) if args.action == "copy" else _verify(args)
    out["seconds"] = round(time.perf_counter() - start, 3)
    out["peak_rss_mb"] = round(_peak_rss_kib() / 1024, 1)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
