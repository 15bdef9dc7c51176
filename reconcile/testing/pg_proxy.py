"""A TCP fault proxy for the Postgres wire protocol: drops a connection around its COMMIT.

The tests arm one fault for the next COMMIT (``arm``); the demo's chaos mode
(``chaos``) draws one for any COMMIT at a seeded rate, so a pipeline runs
through a network that loses COMMITs and their replies.
"""

from __future__ import annotations

import contextlib
import random
import re
import socket
import struct
import threading
from collections import Counter
from dataclasses import dataclass, field

__all__ = [
    "CUT_AFTER_COMMIT_SENT",
    "DROP_AFTER_COMMIT",
    "DROP_BEFORE_COMMIT",
    "FAULTS",
    "FaultProxy",
]

_COMMIT = re.compile(rb"^\s*COMMIT(\s+PREPARED)?\b", re.IGNORECASE)
_UNTYPED_REQUESTS = {80877103, 80877104, 80877102}  # SSLRequest, GSSENCRequest, CancelRequest

DROP_BEFORE_COMMIT = "drop_before_commit"
DROP_AFTER_COMMIT = "drop_after_commit"
CUT_AFTER_COMMIT_SENT = "cut_after_commit_sent"
FAULTS = (DROP_BEFORE_COMMIT, DROP_AFTER_COMMIT, CUT_AFTER_COMMIT_SENT)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


def _is_commit(kind: bytes, body: bytes) -> bool:
    """A simple query ('Q') or an extended-protocol Parse ('P') whose SQL is a COMMIT."""
    if kind == b"Q":
        return bool(_COMMIT.match(body))
    if kind == b"P":
        _name, _, rest = body.partition(b"\x00")
        return bool(_COMMIT.match(rest))
    return False


def _startup_parameter(body: bytes, name: bytes) -> str:
    """A parameter of a startup packet (after its length and protocol code): NUL-separated pairs."""
    fields = body.split(b"\x00")
    for key, value in zip(fields[::2], fields[1::2], strict=False):
        if key == name:
            return value.decode(errors="replace")
    return ""


@dataclass
class _Link:
    client: socket.socket
    server: socket.socket
    swallow: threading.Event = field(default_factory=threading.Event)
    closed: threading.Event = field(default_factory=threading.Event)

    cut: threading.Event = field(default_factory=threading.Event)
    application_name: str = ""  # from the startup packet

    def close(self) -> None:
        self.closed.set()
        for sock in (self.client, self.server):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def cut_after_sending(self) -> None:
        """Drop the client at once; the server gets what was sent, then an orderly EOF.

        Not close() on the server side: closing a socket with unread bytes
        sends an RST, and a server that has not read the COMMIT yet (a loaded
        machine) would lose it with the connection, which is not the fault
        meant. The reader thread drains the server until it hangs up.
        """
        self.cut.set()
        with contextlib.suppress(OSError):
            self.client.shutdown(socket.SHUT_RDWR)
        self.client.close()
        with contextlib.suppress(OSError):
            self.server.shutdown(socket.SHUT_WR)


class FaultProxy:
    """Forwards 127.0.0.1:<port> to a Postgres server, and injects one armed fault.

    ``arm(DROP_BEFORE_COMMIT)``: the next COMMIT is not forwarded; both sides
    are disconnected (the server never sees the COMMIT).
    ``arm(DROP_AFTER_COMMIT)``: the next COMMIT is forwarded, the server's
    reply is swallowed, and both sides are disconnected once it arrived (the
    server committed, the client does not know).
    ``arm(CUT_AFTER_COMMIT_SENT)``: the next COMMIT is forwarded and both sides
    are disconnected at once, without waiting for the server: the COMMIT may
    still be running (e.g. waiting for a synchronous standby) when the client
    starts to ask what became of it.
    """

    def __init__(self, upstream_port: int, upstream_host: str = "127.0.0.1") -> None:
        self.upstream = (upstream_host, upstream_port)
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port: int = self._listener.getsockname()[1]
        self._armed: str | None = None
        self._lock = threading.Lock()
        self.fired = threading.Event()
        self.commits_seen = 0
        self.injected: Counter[str] = Counter()  # fault -> how often it was taken
        self._rng: random.Random | None = None
        self._rate = 0.0
        self._apps: tuple[str, ...] = ()
        self._links: list[_Link] = []
        self._stopped = False
        threading.Thread(target=self._accept, daemon=True, name="fault-proxy").start()

    def arm(self, fault: str) -> None:
        assert fault in FAULTS
        with self._lock:
            self._armed = fault
            self.fired.clear()

    def chaos(self, seed: int, rate: float, *, applications: tuple[str, ...] = ()) -> None:
        """From now on, each COMMIT draws a fault with probability ``rate`` (seeded).

        Args:
            applications: only on connections whose ``application_name`` starts
                with one of these (default: every connection).
        """
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"rate must be in [0, 1], got {rate}")
        with self._lock:
            self._rng, self._rate, self._apps = random.Random(seed), rate, applications

    def _take(self, link: _Link) -> str | None:
        with self._lock:
            fault, self._armed = self._armed, None
            chosen = not self._apps or link.application_name.startswith(self._apps)
            rng = self._rng if fault is None and chosen else None
            if rng is not None and rng.random() < self._rate:
                fault = rng.choice(FAULTS)
            if fault is not None:
                self.injected[fault] += 1
            return fault

    def _accept(self) -> None:
        while not self._stopped:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream)
            except OSError:
                client.close()
                continue
            for sock in (client, server):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            link = _Link(client, server)
            self._links.append(link)
            threading.Thread(target=self._client_to_server, args=(link,), daemon=True).start()
            threading.Thread(target=self._server_to_client, args=(link,), daemon=True).start()

    def _client_to_server(self, link: _Link) -> None:
        try:
            # Untyped start-up messages: SSL/GSS requests, then the startup packet.
            while True:
                head = _recv_exact(link.client, 8)
                length, code = struct.unpack("!ii", head)
                rest = _recv_exact(link.client, length - 8)
                link.server.sendall(head + rest)
                if code not in _UNTYPED_REQUESTS:
                    link.application_name = _startup_parameter(rest, b"application_name")
                    break
            cut_pending = False  # an extended-protocol COMMIT runs at the next Sync
            while not link.closed.is_set():
                kind = _recv_exact(link.client, 1)
                (length,) = struct.unpack("!i", _recv_exact(link.client, 4))
                body = _recv_exact(link.client, length - 4)
                fault = None
                if _is_commit(kind, body):
                    self.commits_seen += 1
                    fault = self._take(link)
                    if fault == DROP_BEFORE_COMMIT:
                        self.fired.set()
                        link.close()
                        return
                    if fault == DROP_AFTER_COMMIT:
                        # From now on the server's bytes are the reply to the
                        # COMMIT (the client waits for it): swallow them.
                        link.swallow.set()
                link.server.sendall(kind + struct.pack("!i", length) + body)
                cut_pending = cut_pending or fault == CUT_AFTER_COMMIT_SENT
                if cut_pending and kind in (b"Q", b"S"):
                    self.fired.set()
                    link.cut_after_sending()
                    return
        except (OSError, ConnectionError, struct.error):
            link.close()

    def _server_to_client(self, link: _Link) -> None:
        try:
            while not link.closed.is_set():
                data = link.server.recv(65536)
                if not data:
                    break
                if link.cut.is_set():
                    continue  # the client is gone: drain until the server hangs up
                if link.swallow.is_set():
                    # The server answered the COMMIT, so it has committed:
                    # the reply is dropped with the connection.
                    self.fired.set()
                    break
                link.client.sendall(data)
        except OSError:
            pass
        link.close()

    def dsn_port(self) -> int:
        return self.port

    def close(self) -> None:
        self._stopped = True
        self._listener.close()
        for link in self._links:
            link.close()
