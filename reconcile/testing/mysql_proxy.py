"""The fault proxy for MariaDB's (MySQL's) wire protocol: drops a connection around its COMMIT.

The same proxy and faults as :mod:`reconcile.testing.pg_proxy` (one accept
loop, one reply path); only the reading of the client's messages differs.
A MySQL packet is a 3-byte little-endian length, a sequence id and the
payload; a command starts a new sequence (id 0), and a COM_QUERY (0x03)
carries its SQL text. The client speaks after the server's greeting, so the
handshake passes through as packets whose sequence id is not 0.
"""

from __future__ import annotations

import contextlib
import re
import socket

from reconcile.testing.pg_proxy import (
    CUT_AFTER_COMMIT_SENT,
    DROP_AFTER_COMMIT,
    DROP_BEFORE_COMMIT,
    FAULTS,
    FaultProxy,
    _Link,
    _recv_exact,
)

__all__ = [
    "CUT_AFTER_COMMIT_SENT",
    "DROP_AFTER_COMMIT",
    "DROP_BEFORE_COMMIT",
    "FAULTS",
    "MysqlFaultProxy",
]

_COM_QUERY = 0x03
_COMMIT = re.compile(rb"^\s*COMMIT\b", re.IGNORECASE)


def is_commit(sequence: int, payload: bytes) -> bool:
    """A command packet (sequence 0) that is a COM_QUERY of COMMIT."""
    return sequence == 0 and payload[:1] == bytes([_COM_QUERY]) and bool(_COMMIT.match(payload[1:]))


class MysqlFaultProxy(FaultProxy):
    """Forwards 127.0.0.1:<port> to a MariaDB server, and injects one armed fault.

    ``arm(DROP_BEFORE_COMMIT)``: the next COMMIT is not forwarded; both sides
    are disconnected. ``arm(DROP_AFTER_COMMIT)``: the COMMIT is forwarded, the
    server's reply swallowed, both sides disconnected once it arrived.
    ``arm(CUT_AFTER_COMMIT_SENT)``: the COMMIT is forwarded and the client cut
    at once (the server may still be committing when the client asks).
    """

    def _client_to_server(self, link: _Link) -> None:
        try:
            while not link.closed.is_set():
                head = _recv_exact(link.client, 4)
                length = int.from_bytes(head[:3], "little")
                payload = _recv_exact(link.client, length)
                fault = None
                if is_commit(head[3], payload):
                    self.commits_seen += 1
                    fault = self._take(link)
                    if fault == DROP_BEFORE_COMMIT:
                        self.fired.set()
                        link.close()
                        return
                    if fault == DROP_AFTER_COMMIT:
                        # The server's next bytes are the COMMIT's reply: swallowed.
                        link.swallow.set()
                link.server.sendall(head + payload)
                if fault == CUT_AFTER_COMMIT_SENT:
                    self.fired.set()
                    link.cut_after_sending()
                    return
        except (OSError, ConnectionError):
            if not link.cut.is_set():  # a partition leaves the server's side open
                link.close()

    def partition(self) -> None:
        """Cut every client off, leaving the server's side open and silent.

        A network partition the server has not noticed: its sessions stay, and
        an open transaction keeps its locks, until the server is told to end them.
        """
        for link in self._links:
            link.cut.set()
            with contextlib.suppress(OSError):
                link.client.shutdown(socket.SHUT_RDWR)
            link.client.close()
