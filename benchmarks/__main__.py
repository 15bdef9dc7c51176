"""Run the whole benchmark set: ``python -m benchmarks [--quick] [--only NAME[,NAME]] [--out DIR]``.

Each benchmark module's own ``main`` runs in turn, in this process, with its
own command-line options: the defaults (the sizes the committed results were
measured at), or with ``--quick`` small sizes that finish in minutes (a check
that every benchmark still runs, not figures to publish: a quick run writes
into a fresh temporary folder unless ``--out`` is given). A benchmark that
fails is reported and the others still run; the exit status is 1 if any
failed.

Benchmarks, in the order they run: hashing, postgres_write, expected_state,
recovery, rebuild, spark, latency, failover, kafka, scale (the last takes an hour or more).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import inspect
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator
from pathlib import Path

from benchmarks.report import RESULTS

__all__ = ["BENCHMARKS", "QUICK", "main"]

BENCHMARKS = (
    "hashing", "postgres_write", "expected_state", "recovery", "rebuild", "spark", "latency",
    "failover", "kafka", "scale",
)  # fmt: skip

# Small sizes per benchmark (each module's own options; see its --help).
QUICK: dict[str, list[str]] = {
    "hashing": ["--rows", "200000"],
    "postgres_write": ["--rows", "20000", "--repeats", "1", "--small-epochs", "20"],
    "expected_state": ["--scale", "0.01", "--epochs", "20", "--baseline-epochs", "2"],
    "recovery": ["--rows", "200000", "--small", "20000"],
    "rebuild": ["--quick"],
    "spark": ["--rows", "200000", "--batches", "4", "--batch-rows", "1000"],
    # 2PC at 30 s too: the README's headline compares the engine with it.
    "latency": ["--quick", "--epochs", "6", "--crash-epochs", "8", "--triggers", "1",
                "--checkpoints", "1,30"],
    "failover": ["--failovers", "2", "--epochs", "30"],
    "kafka": ["--quick"],
    "scale": ["--quick"],
}  # fmt: skip


@contextlib.contextmanager
def _argv(argv: list[str]) -> Iterator[None]:
    """``sys.argv`` for a ``main()`` that reads it (expected_state's takes no arguments)."""
    saved = sys.argv
    sys.argv = [saved[0], *argv]
    try:
        yield
    finally:
        sys.argv = saved


def run_one(name: str, argv: list[str]) -> None:
    """Import ``benchmarks.<name>`` and run its ``main`` with ``argv``.

    Raises:
        RuntimeError: ``main`` returned a non-zero status.
    """
    module = importlib.import_module(f"benchmarks.{name}")
    with _argv(argv):
        # expected_state's main() takes no arguments: it parses sys.argv.
        takes_argv = bool(inspect.signature(module.main).parameters)
        status = module.main(argv) if takes_argv else module.main()
    if status:
        raise RuntimeError(f"benchmarks.{name} exited with status {status}")


def _names(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = sorted(set(names) - set(BENCHMARKS))
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown benchmarks {unknown}; known: {BENCHMARKS}")
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes, minutes not hours")
    parser.add_argument(
        "--only",
        type=_names,
        default=list(BENCHMARKS),
        help="run only these (comma-separated): " + ",".join(BENCHMARKS),
    )
    parser.add_argument("--out", type=Path, default=None,
                        help=f"where reports go (default {RESULTS}; a temporary folder with "
                        "--quick)")  # fmt: skip
    args = parser.parse_args(argv)
    out = args.out
    if out is None:
        out = Path(tempfile.mkdtemp(prefix="reconcile-bench-quick-")) if args.quick else RESULTS
    out.mkdir(parents=True, exist_ok=True)
    failed: list[str] = []
    took: dict[str, float] = {}
    for name in BENCHMARKS:
        if name not in args.only:
            continue
        options = [*(QUICK[name] if args.quick else []), "--out", str(out)]
        print(f"== benchmarks.{name} {' '.join(options)}", flush=True)
        began = time.monotonic()
        try:
            run_one(name, options)
        except (Exception, SystemExit):  # one benchmark's failure does not stop the others
            traceback.print_exc()
            failed.append(name)
        took[name] = time.monotonic() - began
    print(f"\n== summary (reports in {out})")
    for name, seconds in took.items():
        print(f"{name:16} {'FAILED' if name in failed else 'ok':7} {seconds:8.1f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
