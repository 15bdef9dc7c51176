"""The HTTP sink against hostile and misconfigured servers on 127.0.0.1, and its protocol.

Each hostile server is a raw TCP server that writes exactly the bytes a test
wants (a redirect, a 200 MB body, a reply that drips one byte at a time), with
its loops bounded in count and time, and records what it received.
"""

from __future__ import annotations

import json
import logging
import socket
import socketserver
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from reconcile.core.contract import (
    ConfigurationError,
    Fatal,
    FatalError,
    FencedError,
    Ok,
    ReconcileError,
    Retryable,
    RetryableError,
    SinkTxnId,
    WriterIdentity,
)
from reconcile.engine.cycle import CommitCycle, CommitSucceeded
from reconcile.engine.progress_file import FileProgressLog
from sinks.http.sink import HttpSink
from tests.http_receiver import ReceiverServer

pytestmark = pytest.mark.integration

TXN = SinkTxnId("shop", "orders", 3, 1)


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Seen:
    """What a hostile server received and how its replies ended."""

    requests: list[Request] = field(default_factory=list)
    hung_up: list[int] = field(default_factory=list)  # bytes sent when the client left
    finished: int = 0  # replies written to their end


Behaviour = Callable[[Request, socket.socket, Seen], None]


class _Handler(socketserver.BaseRequestHandler):
    server: HostileServer

    def handle(self) -> None:
        self.request.settimeout(5)
        reader = self.request.makefile("rb")
        line = reader.readline(8192).decode("latin-1").rstrip("\r\n")
        if not line:
            return
        method, path, _ = line.split(" ", 2)
        headers: dict[str, str] = {}
        while (raw := reader.readline(8192).decode("latin-1").rstrip("\r\n")) != "":
            name, _, value = raw.partition(":")
            headers[name.strip().lower()] = value.strip()
        body = reader.read(int(headers.get("content-length", "0")))
        request = Request(method, path, headers, body)
        self.server.seen.requests.append(request)
        try:
            self.server.behaviour(request, self.request, self.server.seen)
            self.server.seen.finished += 1
        except OSError:
            pass  # the client hung up; the behaviour recorded how far it got


class HostileServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, behaviour: Behaviour) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.behaviour = behaviour
        self.seen = Seen()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


@pytest.fixture
def hostile() -> Iterator[Callable[[Behaviour], HostileServer]]:
    servers: list[HostileServer] = []

    def start(behaviour: Behaviour) -> HostileServer:
        server = HostileServer(behaviour)
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def _reply(sock: socket.socket, status: str, body: bytes, *extra: str) -> None:
    head = [f"HTTP/1.1 {status}", f"Content-Length: {len(body)}", "Connection: close", *extra]
    sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + body)


def _staged(sink: HttpSink) -> HttpSink:
    assert sink.stage(TXN, [{"k": "a", "v": 1}]) == Ok()
    return sink


# ------------------------------------------------------------------ redirects


def redirect_then_ok(request: Request, sock: socket.socket, seen: Seen) -> None:
    if not request.path.startswith("/landing"):
        _reply(sock, "302 Found", b"", "Location: /landing?session=abc")
    else:  # what a client that follows the redirect re-sends as a GET
        _reply(sock, "200 OK", b'{"ok": true}')


def test_a_redirect_of_a_2pc_call_is_fatal_and_never_followed(hostile: Any) -> None:
    server = hostile(redirect_then_ok)
    sink = HttpSink("orders", server.url, timeout_s=5)
    for outcome in (_staged(sink).prepare(TXN), sink.commit(TXN), sink.abort(TXN)):
        assert isinstance(outcome, Fatal) and "302" in outcome.reason, outcome
        assert "never follow redirects" in outcome.reason and "/landing?***" in outcome.reason
    # The server saw three POSTs and not one GET: nothing was re-sent elsewhere.
    assert [(r.method, r.path.split("/")[1]) for r in server.seen.requests] == [
        ("POST", "prepare"),
        ("POST", "commit"),
        ("POST", "abort"),
    ]
    with pytest.raises(FatalError, match="302"):
        sink.recover()


def ok_without_echo(request: Request, sock: socket.socket, seen: Seen) -> None:
    _reply(sock, "200 OK", b"<html>Please sign in</html>", "Content-Type: text/html")


def test_a_2xx_that_does_not_echo_the_txn_is_never_ok(hostile: Any) -> None:
    server = hostile(ok_without_echo)
    sink = HttpSink("orders", server.url, timeout_s=5)
    for outcome in (_staged(sink).prepare(TXN), sink.commit(TXN), sink.abort(TXN)):
        assert isinstance(outcome, Fatal) and "without echoing the txn" in outcome.reason


def echo_of_another_txn(request: Request, sock: socket.socket, seen: Seen) -> None:
    body = {"status": "committed", "txn": "shop-orders-4-g1", "log_id": None}
    _reply(sock, "200 OK", json.dumps(body).encode())


def test_a_commit_reply_that_echoes_another_epoch_is_never_ok(hostile: Any) -> None:
    server = hostile(echo_of_another_txn)
    outcome = HttpSink("orders", server.url, timeout_s=5).commit(TXN)
    assert isinstance(outcome, Fatal) and "shop-orders-4-g1" in outcome.reason


# ------------------------------------------------------------------ huge replies

HUGE = 200 * 1024 * 1024  # 200 MB, streamed in 1 MB chunks


def huge_body(status: str) -> Behaviour:
    def behaviour(request: Request, sock: socket.socket, seen: Seen) -> None:
        head = f"HTTP/1.1 {status}\r\nContent-Length: {HUGE}\r\nConnection: close\r\n\r\n"
        sock.sendall(head.encode())
        chunk = b"x" * (1024 * 1024)
        sent = 0
        try:
            for _ in range(HUGE // len(chunk)):  # bounded: 200 chunks
                sock.sendall(chunk)
                sent += len(chunk)
        except OSError:
            seen.hung_up.append(sent)
            raise

    return behaviour


@pytest.mark.parametrize("status", ["500 Internal Server Error", "200 OK"])
def test_a_200_mb_reply_is_read_only_up_to_the_limit(hostile: Any, status: str) -> None:
    server = hostile(huge_body(status))
    sink = HttpSink("orders", server.url, timeout_s=30)
    tracemalloc.start()
    try:
        outcome = sink.commit(TXN)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    expected = Retryable if status.startswith("500") else Fatal
    assert isinstance(outcome, expected), outcome.kind
    assert len(outcome.reason) < 1500  # at most 300 characters of the body
    assert peak < 8 * 1024 * 1024  # ~1 MiB read, not 200 MB (nor 600 MB of copies)
    _wait_for(lambda: server.seen.hung_up != [] or server.seen.finished > 0)
    assert server.seen.finished == 0 and server.seen.hung_up[0] < HUGE


# ------------------------------------------------------------------ slow replies

DRIP_STEPS = 300  # bytes, one per DRIP_GAP: 30 s at most, then the server stops
DRIP_GAP = 0.1


def drip(where: str) -> Behaviour:
    def behaviour(request: Request, sock: socket.socket, seen: Seen) -> None:
        if where == "body":
            sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n")
            dripped = b"{" * DRIP_STEPS
        else:  # the status line and headers themselves
            dripped = b"HTTP/1.1 200 OK\r\nX-Slow: " + b"z" * DRIP_STEPS
        for i in range(len(dripped)):
            try:
                sock.sendall(dripped[i : i + 1])
            except OSError:
                seen.hung_up.append(i)
                raise
            time.sleep(DRIP_GAP)

    return behaviour


@pytest.mark.parametrize("where", ["body", "headers"])
def test_a_slow_drip_reply_ends_at_the_calls_deadline(hostile: Any, where: str) -> None:
    server = hostile(drip(where))
    sink = HttpSink("orders", server.url, timeout_s=1.0)  # per byte the server is quick
    outcome = sink.commit(TXN)
    assert isinstance(outcome, Retryable) and "deadline of 1 s" in outcome.reason
    # The client left while the server was still dripping (it would drip for 30 s).
    _wait_for(lambda: server.seen.hung_up != [] or server.seen.finished > 0)
    assert server.seen.finished == 0 and server.seen.hung_up[0] < DRIP_STEPS


def _wait_for(condition: Callable[[], bool]) -> None:
    for _ in range(200):  # bounded: 10 s
        if condition():
            return
        time.sleep(0.05)


# ------------------------------------------------------------------ credentials

SECRETS = ("hunter2pass", "qtok3n", "k3y-value", "b3arer-t0ken")


def echo_everything(request: Request, sock: socket.socket, seen: Seen) -> None:
    # A careless server that quotes the request (its credentials) in its errors.
    text = json.dumps({"path": request.path, "headers": request.headers})
    _reply(sock, "500 Internal Server Error", text.encode())


def test_credentials_never_appear_in_reasons_errors_reprs_or_logs(
    hostile: Any,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
) -> None:
    caplog.set_level(logging.DEBUG)
    server = hostile(echo_everything)
    monkeypatch.setenv("RECEIVER_TOKEN", "b3arer-t0ken")
    base = server.url.replace("http://", "http://ops:hunter2pass@") + "/base?token=qtok3n"
    with pytest.raises(ConfigurationError, match="one way"):
        HttpSink("orders", base, bearer_token_env="RECEIVER_TOKEN")
    sink = HttpSink("orders", base, headers={"X-Api-Key": "k3y-value"}, timeout_s=5)
    token_sink = HttpSink(
        "orders", server.url + "/base?token=qtok3n", bearer_token_env="RECEIVER_TOKEN"
    )
    texts = [repr(sink), repr(token_sink), sink.base_url]
    for s in (sink, token_sink):
        texts += [_staged(s).prepare(TXN).reason, s.commit(TXN).reason]  # type: ignore[union-attr]
        with pytest.raises(RetryableError) as err:
            s.recover()
        texts += [str(err.value), repr(err.value)]
    # A cycle's start() and the logs it writes, with the failing receiver.
    cycle = CommitCycle("shop", [sink], FileProgressLog(tmp_path, "shop"))
    with pytest.raises(ReconcileError) as failed:  # whichever kind start() makes of it
        cycle.start()
    texts += [str(failed.value), caplog.text]
    for text in texts:
        for secret in SECRETS:
            assert secret not in text, (secret, text)
    # And yet the server got every credential, in the right place.
    first = server.seen.requests[0]
    assert first.path == f"/base/prepare/{TXN}?token=qtok3n"
    assert first.headers["x-api-key"] == "k3y-value"
    assert first.headers["authorization"].startswith("Basic ")
    token_prepare = server.seen.requests[3]
    assert token_prepare.headers["authorization"] == "Bearer b3arer-t0ken"


def test_a_missing_token_variable_is_fatal_and_names_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("RECEIVER_TOKEN", raising=False)
    with ReceiverServer() as server:
        sink = HttpSink("orders", server.url, bearer_token_env="RECEIVER_TOKEN")
        outcome = _staged(sink).prepare(TXN)
        assert isinstance(outcome, Fatal) and "'RECEIVER_TOKEN'" in outcome.reason
        assert isinstance(outcome.error, ConfigurationError)
        assert server.state.requests == []  # nothing was sent without it


def test_a_query_token_and_a_base_path_reach_the_receiver_intact(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("RECEIVER_TOKEN", "t0k")
    with ReceiverServer(prefix="/api/v1", required_headers={"Authorization": "Bearer t0k"}) as rx:
        sink = HttpSink("orders", rx.url + "?tenant=7", bearer_token_env="RECEIVER_TOKEN")
        cycle = CommitCycle("shop", [sink], FileProgressLog(tmp_path, "shop"))
        cycle.start()
        assert cycle.run_epoch(0, {"orders": [{"k": "a", "v": 1}]}) == CommitSucceeded(0)
        assert [t for t, _ in rx.state.committed.values()] == ["shop-orders-0-g1"]
        paths = [p for m, p, _ in rx.state.requests if m == "POST"]
        assert paths == [
            "/api/v1/prepare/shop-orders-0-g1?tenant=7",
            "/api/v1/commit/shop-orders-0-g1?tenant=7",
        ]


# ------------------------------------------------------------------ protocol


def answer(status: str, body: dict[str, Any]) -> Behaviour:
    def behaviour(request: Request, sock: socket.socket, seen: Seen) -> None:
        _reply(sock, status, json.dumps(body).encode())

    return behaviour


@pytest.mark.parametrize(
    ("status", "body", "kind", "error"),
    [
        ("429 Too Many Requests", {}, Retryable, RetryableError),
        ("503 Service Unavailable", {}, Retryable, RetryableError),
        ("409 Conflict", {"error": "fenced", "txn": str(TXN)}, Fatal, FencedError),
        ("404 Not Found", {"error": "never prepared"}, Fatal, FatalError),
    ],
)
def test_status_codes_map_to_typed_outcomes(
    hostile: Any, status: str, body: dict[str, Any], kind: type, error: type
) -> None:
    server = hostile(answer(status, body))
    outcome = HttpSink("orders", server.url, timeout_s=5).commit(TXN)
    assert isinstance(outcome, kind) and isinstance(outcome.error, error), outcome


def test_a_connection_refused_is_retryable() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    outcome = HttpSink("orders", f"http://127.0.0.1:{port}", timeout_s=2).commit(TXN)
    assert isinstance(outcome, Retryable)


def test_the_receiver_refuses_a_commit_of_another_logs_prepared_batch() -> None:
    with ReceiverServer() as server:
        a, b = HttpSink("orders", server.url), HttpSink("orders", server.url)
        a.bind(WriterIdentity("shop", "log-a"))
        b.bind(WriterIdentity("shop", "log-b"))
        assert _staged(a).prepare(TXN) == Ok()
        outcome = b.commit(TXN)  # the same txn id, another progress log
        assert isinstance(outcome, Fatal) and "'log-a'" in outcome.reason
        assert server.state.committed == {} and server.state.commit_log == []
        assert a.commit(TXN) == Ok()


@pytest.mark.parametrize(
    "url", ["ftp://host/x", "http:///nohost", "http://host:99999/x", "http://h/x#frag"]
)
def test_a_bad_base_url_is_a_configuration_error(url: str) -> None:
    with pytest.raises(ConfigurationError):
        HttpSink("orders", url)


def test_a_header_value_with_a_newline_is_refused_without_showing_it() -> None:
    with pytest.raises(ConfigurationError) as err:
        HttpSink("orders", "http://127.0.0.1:1", headers={"X-Key": "s3cr3t\r\nX-Evil: 1"})
    assert "s3cr3t" not in str(err.value)
