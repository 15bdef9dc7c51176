"""One bounded HTTP exchange for the HTTP sink: an overall deadline, a read limit, no redirects.

Why http.client and a watchdog instead of urllib, requests or httpx: their
timeouts apply to each socket operation, so a reply that drips one byte per
second never ends, and none offers an overall deadline for a synchronous call.
Here a timer shuts the socket down when the call's deadline passes, whatever
it is blocked in (connect excepted, which has its own timeout; send; status
line; headers; body). http.client also never follows a redirect, which
urllib does by re-sending a POST as a body-less GET.

Credentials (URL user info, ``?query`` values, header values, a bearer
token) are kept in a :class:`Secrets` and scrubbed from every text this
module or the sink builds from a reply or an error.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import socket
import ssl
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import parse_qsl, quote, unquote, urlsplit

from reconcile.core.contract import ConfigurationError, RetryableError
from reconcile.core.redaction import Redactor

__all__ = ["Endpoint", "Reply", "Secrets", "exchange", "parse_endpoint"]

_CHUNK = 64 * 1024


class Secrets:
    """Strings that must never appear in a message, a log line or a repr."""

    def __init__(self, values: Iterable[str] = ()) -> None:
        self._values = sorted({v for v in values if v}, key=len, reverse=True)
        # The core's one redaction: each value in every form (percent-encoded,
        # escaped, base64), then every secret shape (a URI's password, a
        # secret-named parameter).
        self._redact = Redactor(self._values)

    def with_value(self, value: str) -> Secrets:
        """These secrets and ``value``."""
        return Secrets([*self._values, value])

    def scrub(self, text: str) -> str:
        """``text`` with every secret replaced by ``***``."""
        return self._redact(text)


@dataclass(frozen=True, repr=False)
class Endpoint:
    """Where the receiver is: a base URL split into parts, credentials held apart."""

    scheme: str
    host: str
    port: int
    base_path: str  # no trailing '/'
    query: str  # kept on every request (some gateways need it); never shown
    authorization: str | None  # from user info in the URL, as a Basic header value

    def target(self, path: str) -> str:
        """The request target of ``path`` (relative to the base), with the base's query."""
        return f"{self.base_path}/{path}" + (f"?{self.query}" if self.query else "")

    def shown(self, path: str = "") -> str:
        """The URL of ``path`` as messages show it: no user info, query values hidden."""
        query = "&".join(f"{k}=***" for k, _ in parse_qsl(self.query, keep_blank_values=True))
        suffix = f"/{path}" if path else ""
        return f"{self.scheme}://{self.host}:{self.port}{self.base_path}{suffix}" + (
            f"?{query}" if query else ""
        )

    def __repr__(self) -> str:
        return f"Endpoint({self.shown()!r})"


def parse_endpoint(base_url: str, what: str) -> tuple[Endpoint, Secrets]:
    """Split ``base_url``; user info becomes a Basic authorization header.

    Raises:
        ConfigurationError: not http(s), no host, or a fragment; the message
            never repeats the URL's credentials.
    """
    if not isinstance(base_url, str):
        raise ConfigurationError(f"{what}: base URL must be a string, got {type(base_url)}")
    parts = urlsplit(base_url)
    secrets = Secrets(
        [parts.password or "", parts.username or ""]
        + [v for _, v in parse_qsl(parts.query, keep_blank_values=True)]
    )
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigurationError(
            f"{what}: base URL must be http(s)://host[:port][/path], got "
            f"{secrets.scrub(base_url)!r}"
        )
    if parts.fragment:
        raise ConfigurationError(f"{what}: base URL must not have a #fragment")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        raise ConfigurationError(f"{what}: base URL has an invalid port: {exc}") from exc
    authorization = None
    if parts.username is not None:
        pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
        authorization = "Basic " + base64.b64encode(pair.encode()).decode()
        secrets = secrets.with_value(authorization).with_value(pair)
    endpoint = Endpoint(
        scheme=parts.scheme,
        host=parts.hostname,
        port=port,
        base_path=quote(parts.path.rstrip("/"), safe="/%:@!$&'()*+,;=-._~"),
        query=parts.query,
        authorization=authorization,
    )
    return endpoint, secrets


@dataclass(frozen=True)
class Reply:
    """What came back: the status, the Location header, and at most ``limit`` body bytes."""

    status: int
    location: str | None
    body: bytes
    truncated: bool  # more body followed than was read


def _read_bounded(response: http.client.HTTPResponse, limit: int) -> tuple[bytes, bool]:
    """Read at most ``limit`` bytes of the body; True if more followed (left unread)."""
    chunks: list[bytes] = []
    size = 0
    while size <= limit:
        chunk = response.read(min(_CHUNK, limit + 1 - size))
        if not chunk:
            if response.length:
                # http.client returns b"" when the connection ends before the
                # announced Content-Length (a drop, or the watchdog): a cut reply.
                raise http.client.IncompleteRead(b"".join(chunks), response.length)
            return b"".join(chunks), False
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)[:limit], True


def exchange(
    endpoint: Endpoint,
    method: str,
    path: str,
    body: bytes | None,
    headers: Mapping[str, str],
    *,
    deadline_s: float,
    limit: int,
) -> Reply:
    """Send one request and read its reply, all within ``deadline_s`` seconds.

    Args:
        endpoint: the receiver.
        method: "GET" or "POST".
        path: relative to the endpoint's base path.
        body: the request body, if any.
        headers: request headers (credentials included).
        deadline_s: the overall deadline: connect, send and the whole reply.
        limit: the most body bytes read; the rest is left unread and the
            connection closed.

    Returns:
        The reply; redirects are returned as they are, never followed.

    Raises:
        RetryableError: no reply within the deadline, or a network error (the
            message names the URL without credentials; the caller scrubs it).
    """
    connection: http.client.HTTPConnection
    if endpoint.scheme == "https":
        connection = http.client.HTTPSConnection(
            endpoint.host, endpoint.port, timeout=deadline_s, context=ssl.create_default_context()
        )
    else:
        connection = http.client.HTTPConnection(endpoint.host, endpoint.port, timeout=deadline_s)
    expired = threading.Event()

    def expire() -> None:
        # Runs on the timer thread: unblock whatever the call is waiting in.
        expired.set()
        sock = connection.sock
        if sock is not None:
            with contextlib.suppress(OSError):  # closed already: the call has finished
                sock.shutdown(socket.SHUT_RDWR)

    watchdog = threading.Timer(deadline_s, expire)
    watchdog.daemon = True
    watchdog.start()
    try:
        connection.connect()
        if expired.is_set():  # the deadline passed during connect, before a socket existed
            raise TimeoutError("deadline passed while connecting")
        connection.request(method, endpoint.target(path), body=body, headers=dict(headers))
        response = connection.getresponse()
        data, truncated = _read_bounded(response, limit)
        if expired.is_set():  # a reply that ended because the watchdog cut it
            raise TimeoutError("deadline passed while reading the reply")
        return Reply(response.status, response.getheader("Location"), data, truncated)
    except (OSError, http.client.HTTPException) as exc:
        if expired.is_set():
            raise RetryableError(
                f"{method} {endpoint.shown(path)}: no complete reply within the deadline of "
                f"{deadline_s:g} s; the call was abandoned"
            ) from None
        # Not chained: http.client's own texts may quote the request target,
        # query credentials included. The caller scrubs this message too.
        raise RetryableError(
            f"{method} {endpoint.shown(path)}: {type(exc).__name__}: {exc}"
        ) from None
    finally:
        watchdog.cancel()
        connection.close()
