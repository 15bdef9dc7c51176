"""Benchmark: the file sink on S3 (``sinks.s3``) against moto's S3 server on 127.0.0.1.

Run: ``.venv/bin/python -m benchmarks.sinks_s3 [--small-epochs 200] [--rows 1000000] [--out DIR]``.
It starts moto's server (the ``test`` extra) unless ``AWS_ENDPOINT_URL`` names an endpoint
already, and measures:

- a small epoch's commit (stage, prepare, commit of 100 rows): p50 and p95 in ms;
- one epoch of ``--rows`` rows, staged to committed: rows/s;
- a full read-back check: every committed batch read through the log, each row hashed
  (``reconcile.core.hashing``) and diffed against the expected rows: rows/s. The file sink
  has no ``reconcile verify`` of its own (it is not pullable); this is the work such a check does.

Its part goes under the key ``"s3_files"`` of ``sinks.json`` in ``--out`` (default
``benchmarks/results``); other sinks' parts in that file are kept. Figures are for moto on
this machine (an in-memory server a loopback hop away), not for AWS; no test asserts them.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa

from benchmarks.report import RESULTS, machine, now, versions

__all__ = ["main"]

_ENV = {
    "AWS_REGION": "us-east-1",
    "AWS_ACCESS_KEY_ID": "bench",
    "AWS_SECRET_ACCESS_KEY": "bench-secret",
}


def _start_moto() -> subprocess.Popen[bytes]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            with urllib.request.urlopen(f"{url}/moto-api/", timeout=1):
                break
        except OSError:
            time.sleep(0.1)
    os.environ.update({**_ENV, "AWS_ENDPOINT_URL": url})
    return server


def _rows(epoch: int, count: int) -> list[dict[str, Any]]:
    return [{"k": epoch * 10_000_000 + i, "v": f"value-{i}", "n": i * 0.5} for i in range(count)]


def _commit(sink: Any, epoch: int, rows: list[dict[str, Any]]) -> None:
    from reconcile.core.contract import OK, SinkTxnId

    txn = SinkTxnId("bench", sink.name, epoch, 1)
    for step in (
        lambda: sink.stage(txn, rows),
        lambda: sink.prepare(txn),
        lambda: sink.commit(txn),
    ):
        outcome = step()
        if outcome != OK:
            raise RuntimeError(f"{txn}: {outcome}")


def _hashes(rows: list[dict[str, Any]]) -> dict[int, int]:
    from reconcile.core.hashing import row_hash_arrow

    table = pa.Table.from_pylist(rows)
    return dict(
        zip(
            table.column("k").to_pylist(),
            row_hash_arrow(table, ["v", "n"]).to_pylist(),
            strict=True,
        )
    )


def run(uri: str, small_epochs: int, big_rows: int) -> dict[str, Any]:
    """The three measurements on fresh sinks under ``uri``."""
    from reconcile.core.contract import WriterIdentity
    from sinks.s3.sink import open_uri

    small = open_uri("small", uri)
    small.bind(WriterIdentity("bench", "bench-log"))
    times = []
    for epoch in range(small_epochs):
        rows = _rows(epoch, 100)
        start = time.perf_counter()
        _commit(small, epoch, rows)
        times.append((time.perf_counter() - start) * 1000)
    quantiles = statistics.quantiles(times, n=20)

    big = open_uri("big", uri)
    big.bind(WriterIdentity("bench", "bench-log"))
    rows = _rows(0, big_rows)
    start = time.perf_counter()
    _commit(big, 0, rows)
    write_s = time.perf_counter() - start

    expected = _hashes(rows)
    start = time.perf_counter()
    state = big.log.refresh()
    found: list[dict[str, Any]] = []
    for entry in state.committed.values():
        body = big.bucket.get(entry.batch) or b""
        found.extend(json.loads(line) for line in body.splitlines()[1:])
    differ = sum(1 for k, h in _hashes(found).items() if expected.get(k) != h)
    verify_s = time.perf_counter() - start
    if differ or len(found) != big_rows:
        raise RuntimeError(f"read-back found {len(found)} rows, {differ} differing")
    return {
        "small_epoch_commit_ms": {
            "rows": 100,
            "epochs": small_epochs,
            "p50": round(statistics.median(times), 2),
            "p95": round(quantiles[18], 2),
        },
        "big_epoch": {
            "rows": big_rows,
            "seconds": round(write_s, 2),
            "rows_per_s": round(big_rows / write_s),
        },
        "full_read_back_check": {
            "rows": big_rows,
            "seconds": round(verify_s, 2),
            "rows_per_s": round(big_rows / verify_s),
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--small-epochs", type=int, default=200)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    server = None if os.environ.get("AWS_ENDPOINT_URL") else _start_moto()
    try:
        import boto3

        bucket = f"bench-{uuid.uuid4().hex[:12]}"
        boto3.client("s3").create_bucket(Bucket=bucket)
        figures = run(f"s3://{bucket}/sinks", args.small_epochs, args.rows)
    finally:
        if server is not None:
            server.terminate()
            server.wait()
    part = {
        "when": now(),
        "endpoint": "moto's S3 server on 127.0.0.1" if server is not None else "AWS_ENDPOINT_URL",
        # The machine is shared: the load during the run says how far to trust the figures.
        "machine": machine(load_average_1m=round(os.getloadavg()[0], 2)),
        "versions": versions("boto3", "moto", "pyarrow"),
        **figures,
    }
    path = args.out / "sinks.json"
    report = json.loads(path.read_text()) if path.exists() else {}
    report["s3_files"] = part  # the other sinks' parts stay as they are
    args.out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(part, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
