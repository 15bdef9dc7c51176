"""The S3 part of the sink benchmarks: the file sink on moto's S3 server on 127.0.0.1.

moto in server mode is a separate process a loopback hop away, in memory: the
figures are the sink's own costs plus moto's, not AWS's (whose round trips are
tens of milliseconds). The sink writes one JSON-lines batch object per epoch
and makes it visible with a conditional put of a log entry. The figures:
``benchmarks/sink_harness.py``; the verify is ``reconcile.recover``, which
folds the log's batches into the sink's rows.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from benchmarks.sink_harness import TABLE, Part, measure

__all__ = ["WRITE_PATH", "run"]

WRITE_PATH = (
    "an epoch is one batch object (its rows encoded as JSON lines in Python, one PutObject) "
    "and one commit-log entry created with If-None-Match: * after the log is listed; the "
    "verify reads every batch the log names and folds its JSON lines by key in Python"
)

# moto's test credentials; never a real account's.
_ENV = {"AWS_REGION": "us-east-1", "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench-secret", "AWS_ALLOW_HTTP": "true"}  # fmt: skip


def _start_moto() -> tuple[subprocess.Popen[bytes], str]:
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
                return server, url
        except OSError:
            time.sleep(0.1)
    server.kill()
    raise RuntimeError("moto's S3 server did not start on 127.0.0.1")


def run(small_epochs: int, big_rows: int) -> dict[str, Any]:
    """The part's figures, on a moto server and bucket started and removed here."""
    import boto3

    from sinks.s3.sink import open_uri

    server, url = _start_moto()
    saved = {name: os.environ.get(name) for name in [*_ENV, "AWS_ENDPOINT_URL"]}
    os.environ.update({**_ENV, "AWS_ENDPOINT_URL": url})
    try:
        bucket = f"bench-{uuid.uuid4().hex[:12]}"
        boto3.client("s3").create_bucket(Bucket=bucket)
        uri = f"s3://{bucket}/sinks"
        with tempfile.TemporaryDirectory() as tmp:
            part = Part(
                system="S3 (moto server on 127.0.0.1)",
                sink="S3FileSink (boto3)",
                open=lambda: open_uri(TABLE, uri),
                verify_uri=uri,
                servers=(server.pid,),
                shape=lambda table: table.to_pylist(),
            )
            return measure(part, Path(tmp), small_epochs, big_rows)
    finally:
        server.terminate()
        server.wait()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
