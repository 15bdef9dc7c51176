"""Fixture plugin: a real S3 endpoint on 127.0.0.1 (moto's server), one per test worker.

The endpoint is moto in server mode (``python -m moto.server``): real HTTP, real
SigV4 requests, conditional puts answered with 412, so the code under test
speaks the S3 API exactly as it does to AWS or MinIO; nothing of boto3 is
patched. The server is a process of the worker's, started on the first test
that asks for it and shared by the rest of the session; every test
gets a bucket of its own. Subprocesses a test starts inherit the endpoint
through the standard variables (``AWS_ENDPOINT_URL``, ``AWS_REGION``, the
keys, ``AWS_ALLOW_HTTP`` for delta-rs on plain HTTP).

A test that needs the endpoint and cannot get it fails, naming the extra to
install: a skipped test proves nothing.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

# Test credentials for moto; never a real account's.
_ENV = {
    "AWS_REGION": "us-east-1",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_ACCESS_KEY_ID": "reconcile-test",
    "AWS_SECRET_ACCESS_KEY": "reconcile-test-secret",
    # delta-rs (object_store) refuses plain HTTP unless told; moto serves HTTP.
    "AWS_ALLOW_HTTP": "true",
}


@dataclass(frozen=True)
class S3Endpoint:
    """The worker's S3 endpoint and the variables that point a client at it."""

    url: str
    env: dict[str, str]

    def client(self) -> Any:
        """A boto3 S3 client of the endpoint (for set-up and inspection)."""
        import boto3

        return boto3.client("s3", endpoint_url=self.url, region_name=_ENV["AWS_REGION"])

    def new_bucket(self) -> str:
        """Create a bucket of its own for one test; its name."""
        name = f"t-{uuid.uuid4().hex[:20]}"
        self.client().create_bucket(Bucket=name)
        return name


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _start_server() -> tuple[subprocess.Popen[bytes], str]:
    """moto's server in a process of its own; the process and its URL once it answers."""
    for _ in range(3):  # a port taken between the probe and the bind: another one
        port = _free_port()
        server = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and server.poll() is None:
            try:
                with urllib.request.urlopen(f"{url}/moto-api/", timeout=1):
                    return server, url
            except OSError:
                time.sleep(0.1)
        server.kill()
        server.wait()
    pytest.fail("moto's S3 server did not start on 127.0.0.1 (three ports tried)")


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[S3Endpoint]:
    """moto's S3 server on 127.0.0.1, the environment pointed at it for the session.

    A process, not a thread of the worker: a delta-rs call that holds the GIL
    while it waits for its HTTP reply (``DeltaTable.history`` does) would
    otherwise wait for a server that cannot run.
    """
    try:
        import moto.server  # noqa: F401
    except ImportError as exc:  # fail, never skip
        pytest.fail(
            f"the S3 tests need moto's server ({exc}): pip install 'reconcile-engine[test]'"
        )
    server, url = _start_server()
    env = {**_ENV, "AWS_ENDPOINT_URL": url}
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        endpoint = S3Endpoint(url, env)
        endpoint.client().list_buckets()  # it answers, or the test fails here
        yield endpoint
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


@pytest.fixture
def s3_bucket(s3_endpoint: S3Endpoint) -> str:
    """A new, empty bucket on the worker's endpoint."""
    return s3_endpoint.new_bucket()


class S3Harness:
    """File sinks on S3 under one bucket; inspection folds the log and reads the batches."""

    kind = "s3"

    def __init__(self, bucket: str) -> None:
        # The endpoint and the keys come from the environment (a kill -9
        # test's subprocess builds its harness from the bucket's name alone).
        self.bucket = bucket
        self.uri = f"s3://{bucket}/file-sinks"

    def _client(self) -> Any:
        import boto3

        return boto3.client("s3")

    def new_sink(self, name: str) -> Any:
        from sinks.s3.sink import open_uri

        return open_uri(name, self.uri)

    def _state(self, name: str) -> Any:
        from sinks.s3.log import CommitLog
        from sinks.s3.objects import Bucket, parse_s3_uri

        return CommitLog(Bucket(parse_s3_uri(name, self.uri).child(name))).refresh()

    def _read(self, name: str, relative: str) -> bytes:
        key = f"file-sinks/{name}/{relative}"
        return bytes(self._client().get_object(Bucket=self.bucket, Key=key)["Body"].read())

    def committed(self, name: str) -> dict[int, list[Any]]:
        found: dict[int, list[Any]] = {}
        for (_, _, epoch), entry in sorted(self._state(name).committed.items()):
            lines = self._read(name, entry.batch).splitlines()
            found.setdefault(epoch, []).extend(json.loads(line) for line in lines[1:])
        return found

    def prepared(self, name: str) -> list[Any]:
        from reconcile.core.contract import SinkTxnId

        committed = {entry.txn for entry in self._state(name).committed.values()}
        listing = self._client().list_objects_v2(
            Bucket=self.bucket, Prefix=f"file-sinks/{name}/batches/"
        )
        names = [item["Key"].rsplit("/", 1)[1] for item in listing.get("Contents", ())]
        txns = [n.removesuffix(".batch") for n in names if n.endswith(".batch")]
        return sorted(SinkTxnId.from_string(t) for t in txns if t not in committed)


@pytest.fixture
def s3_harness(s3_endpoint: S3Endpoint, s3_bucket: str) -> S3Harness:
    return S3Harness(s3_bucket)
