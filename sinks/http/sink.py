"""HTTP two-phase-commit sink: POST /prepare, /commit, /abort per txn; GET /pending to recover.

The protocol (request and reply shapes, headers, status codes) is documented
in docs/http.md; ``tests/http_receiver.py`` is a reference receiver.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from reconcile.core.claims import Claim
from reconcile.core.contract import (
    OK,
    ConfigurationError,
    Fatal,
    FatalError,
    FencedError,
    Retryable,
    RetryableError,
    SinkOutcome,
    SinkTxnId,
    TxnIdParseError,
    WriterIdentity,
    validate_name,
)
from reconcile.core.sink import SinkCapabilities
from sinks.http.transport import Reply, Secrets, exchange, parse_endpoint
from sinks.ownership import WriterBinding, foreign_commit

__all__ = ["LOG_ID_HEADER", "HttpSink"]

# The request header that carries the writer's progress log id on every call;
# the receiver stores it with a prepared batch and echoes it with a commit.
LOG_ID_HEADER = "Reconcile-Log-Id"
# Headers the sink sets itself: a caller's ``headers`` may not override them.
_OWN_HEADERS = {"content-type", "content-length", "host", LOG_ID_HEADER.lower()}
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # an HTTP header name (RFC 9110)
# Statuses that say "not now" rather than "never": retried like a 5xx.
_TRANSIENT = {408, 425, 429}
_REASON_CHARS = 300  # the most characters of a reply body put into an outcome's reason
# What a 2xx reply of each call may say, and whether its txn must be the very
# txn asked about (True) or may be another generation of the same epoch (False).
_ECHOES: dict[str, dict[str, bool]] = {
    "prepare": {"prepared": True, "already committed": False},
    "commit": {"committed": True, "already committed": False},
    "abort": {"aborted": True},
}


class HttpSink:
    """A TwoPhaseSink that speaks a small REST protocol to a receiver (docs/http.md).

    - ``POST {base}/prepare/{txn}`` with the batch as JSON lines: the receiver
      makes it durable but invisible;
    - ``POST {base}/commit/{txn}``: visible, atomically; 200 if already committed;
    - ``POST {base}/abort/{txn}``: discard; 200 if unknown;
    - ``GET {base}/pending``: a JSON list of prepared, uncommitted txn ids.

    Every 2xx reply to a POST is a JSON object that echoes the txn (``txn``),
    says what happened (``status``) and, for a commit, which progress log the
    batch was written for (``log_id``); a 2xx without that echo (a proxy's
    page, another service) is Fatal, never OK. Redirects are never followed
    (Fatal: a redirected POST can come back as a body-less GET). 5xx, 408,
    425, 429, timeouts and connection errors are Retryable (every call is
    idempotent); 409 and other 4xx are Fatal.

    ``timeout_s`` is each call's overall deadline (connect, send, the whole
    reply); at most ``max_reply_bytes`` of a reply are read, and at most 300
    characters of it go into a reason. Credentials go in ``headers`` (values
    are secret), in a bearer token read from the environment variable
    ``bearer_token_env`` at each call, or as user info in the URL (sent as
    Basic auth); ``?query`` parameters of the URL are kept on every call.
    None of them appears in a reason, an error or the repr.

    ``bind(writer)`` sends the writer's progress log id (``Reconcile-Log-Id``)
    with every call; a commit the receiver reports for another
    log (or for none, when bound) is a Fatal MarkerMismatchError, never OK.
    Unbound, the header is not sent and the sink accepts only commits the
    receiver holds without a log id.
    """

    capabilities = SinkCapabilities(durable_prepare=True)

    def __init__(
        self,
        name: str,
        base_url: str,
        *,
        timeout_s: float = 10.0,
        headers: Mapping[str, str] | None = None,
        bearer_token_env: str | None = None,
        max_reply_bytes: int = 1 << 20,
    ) -> None:
        """Build a sink client for the receiver at ``base_url``.

        Args:
            name: the sink name ([A-Za-z0-9_]).
            base_url: ``http(s)://[user:password@]host[:port][/path][?query]``.
            timeout_s: the overall deadline of each call, in seconds.
            headers: extra request headers, e.g. an API key; values are secret.
            bearer_token_env: the name of an environment variable holding a
                bearer token, read at each call (so it can be rotated).
            max_reply_bytes: the most bytes of a reply body that are read.

        Raises:
            ConfigurationError: a bad URL, header, deadline or limit; the
                message never contains a credential.
        """
        self._name = validate_name("sink", name)
        what = f"HTTP sink {name!r}"
        self._endpoint, secrets = parse_endpoint(base_url, what)
        if not isinstance(timeout_s, int | float) or not 0 < timeout_s < 24 * 3600:
            raise ConfigurationError(f"{what}: timeout_s must be a number of seconds > 0")
        if not isinstance(max_reply_bytes, int) or max_reply_bytes < 1024:
            raise ConfigurationError(f"{what}: max_reply_bytes must be an int >= 1024")
        extra = dict(headers or {})
        for key, value in extra.items():
            if not isinstance(key, str) or not _TOKEN.fullmatch(key):
                raise ConfigurationError(f"{what}: {key!r} is not a valid header name")
            if key.lower() in _OWN_HEADERS:
                raise ConfigurationError(f"{what}: header {key!r} is set by the sink itself")
            if not isinstance(value, str) or any(c in value for c in "\r\n\0"):
                # The value is not shown: it may be a credential.
                raise ConfigurationError(f"{what}: the value of header {key!r} is not valid")
            secrets = secrets.with_value(value)
        has_authorization = any(k.lower() == "authorization" for k in extra)
        sources = [
            has_authorization,
            bearer_token_env is not None,
            bool(self._endpoint.authorization),
        ]
        if sum(sources) > 1:
            raise ConfigurationError(
                f"{what}: give credentials one way: an Authorization header, "
                "bearer_token_env, or user info in the URL"
            )
        if bearer_token_env is not None and not (
            isinstance(bearer_token_env, str) and bearer_token_env
        ):
            raise ConfigurationError(f"{what}: bearer_token_env must be a variable name")
        self._extra_headers = extra
        self._bearer_env = bearer_token_env
        self._secrets = secrets
        self.timeout_s = float(timeout_s)
        self.max_reply_bytes = max_reply_bytes
        self._staged: dict[SinkTxnId, bytes] = {}
        self._binding = WriterBinding(what)

    @property
    def name(self) -> str:
        return self._name

    @property
    def base_url(self) -> str:
        """The receiver's base URL as shown: no user info, query values hidden."""
        return self._endpoint.shown()

    def __repr__(self) -> str:
        return (
            f"HttpSink(name={self._name!r}, url={self.base_url!r}, "
            f"headers={sorted(self._extra_headers)}, bearer_token_env={self._bearer_env!r}, "
            f"timeout_s={self.timeout_s:g})"
        )

    def bind(self, writer: WriterIdentity) -> None:
        """Serve ``writer`` (idempotent); see :class:`sinks.ownership.WriterBinding`."""
        self._binding.bind(writer)

    # ------------------------------------------------------------------ contract

    def stage(self, txn_id: SinkTxnId, rows: Iterable[Any]) -> SinkOutcome:
        lines = []
        for i, row in enumerate(rows):
            try:
                lines.append(json.dumps(row, sort_keys=True, allow_nan=False))
            except (TypeError, ValueError) as exc:
                return Fatal(f"sink {self._name!r}, {txn_id}: row {i} ({row!r}) is not JSON: {exc}")
        self._staged[txn_id] = "".join(line + "\n" for line in lines).encode()
        return OK

    def prepare(self, txn_id: SinkTxnId) -> SinkOutcome:
        body = self._staged.get(txn_id)
        if body is None:
            return Retryable(f"{txn_id}: nothing staged in this process")
        outcome = self._post("prepare", txn_id, body)
        if outcome:
            del self._staged[txn_id]
        return outcome

    def commit(self, txn_id: SinkTxnId) -> SinkOutcome:
        return self._post("commit", txn_id, b"")

    def abort(self, txn_id: SinkTxnId) -> SinkOutcome:
        self._staged.pop(txn_id, None)
        return self._post("abort", txn_id, b"")

    def recover(self) -> Sequence[SinkTxnId]:
        """Txns the receiver holds prepared, of this sink.

        Raises:
            RetryableError: the receiver did not answer, or answered 5xx/408/429.
            FatalError: any other answer that is not a JSON list of txn ids.
            ConfigurationError: the bearer token's variable is not set.
        """
        what = f"sink {self._name!r}: GET {self._endpoint.shown('pending')}"
        reply, secrets = self._exchange("GET", "pending", None)
        if reply.status in _TRANSIENT or reply.status >= 500:
            raise RetryableError(f"{what} answered {reply.status}: {_snippet(reply, secrets)}")
        if reply.status != 200 or reply.truncated:
            raise FatalError(
                f"{what} answered {reply.status}"
                + (f" with more than {self.max_reply_bytes} bytes" if reply.truncated else "")
                + f": {_snippet(reply, secrets)}"
            )
        try:
            listed = json.loads(reply.body)
        except ValueError:
            listed = None
        if not isinstance(listed, list):
            raise FatalError(f"{what}: not a JSON list: {_snippet(reply, secrets)}")
        txns = []
        for text in listed:
            try:
                txn = SinkTxnId.from_string(text)
            except TxnIdParseError:
                continue  # not a txn of this engine
            if txn.sink == self._name:  # one receiver may serve several sinks
                txns.append(txn)
        return txns

    # ----------------------------------------------------------------- internals

    def _request_headers(self) -> tuple[dict[str, str], Secrets]:
        """The headers of one call, and the secrets to scrub (the current token too)."""
        headers = {"Content-Type": "application/x-ndjson", **self._extra_headers}
        secrets = self._secrets
        if self._endpoint.authorization is not None:
            headers["Authorization"] = self._endpoint.authorization
        if self._bearer_env is not None:
            token = os.environ.get(self._bearer_env, "")
            if not token or any(c in token for c in "\r\n\0"):
                raise ConfigurationError(
                    f"HTTP sink {self._name!r}: environment variable {self._bearer_env!r} "
                    "(the bearer token) is not set, empty or not a valid header value"
                )
            headers["Authorization"] = f"Bearer {token}"
            secrets = secrets.with_value(token)
        if self._binding.log_id is not None:
            headers[LOG_ID_HEADER] = self._binding.log_id
        return headers, secrets

    def _exchange(self, method: str, path: str, body: bytes | None) -> tuple[Reply, Secrets]:
        headers, secrets = self._request_headers()
        try:
            reply = exchange(
                self._endpoint,
                method,
                path,
                body,
                headers,
                deadline_s=self.timeout_s,
                limit=self.max_reply_bytes,
            )
        except RetryableError as exc:
            raise RetryableError(secrets.scrub(f"sink {self._name!r}: {exc}")) from None
        return reply, secrets

    def _post(self, action: str, txn_id: SinkTxnId, body: bytes) -> SinkOutcome:
        try:
            reply, secrets = self._exchange("POST", f"{action}/{txn_id}", body)
        except RetryableError as exc:
            return Retryable.of(exc)
        except ConfigurationError as exc:
            return Fatal.of(exc)
        what = f"sink {self._name!r}: POST {self._endpoint.shown(f'{action}/{txn_id}')}"
        status = reply.status
        if 200 <= status < 300:
            return self._check_echo(what, action, txn_id, reply, secrets)
        text = _snippet(reply, secrets)
        if 300 <= status < 400:
            # urllib would follow it, re-sending the POST as a body-less GET whose
            # 200 would pass for a commit: a 2PC call is never redirected.
            return Fatal.of(
                ConfigurationError(
                    f"{what} answered {status}, a redirect to "
                    f"{_shown_location(reply.location, secrets)}; 2PC calls never follow "
                    "redirects: set the sink's base URL to the receiver's own address"
                )
            )
        if status in _TRANSIENT or status >= 500:
            return Retryable.of(RetryableError(f"{what} answered {status}: {text}"))
        if status == 409 and _json_object(reply).get("error") == "fenced":
            return Fatal.of(FencedError(f"{what} answered 409, fenced: {text}"))
        if status == 409 and action == "commit" and "log_id" in _json_object(reply):
            # The receiver refused to commit a batch prepared for another log.
            mismatch = self._log_mismatch(txn_id, action, _json_object(reply))
            if mismatch is not None:
                return mismatch
        return Fatal.of(FatalError(f"{what} answered {status}: {text}"))

    def _check_echo(
        self, what: str, action: str, txn_id: SinkTxnId, reply: Reply, secrets: Secrets
    ) -> SinkOutcome:
        """OK only for a reply that echoes this txn and, for a commit, this writer's log."""
        payload = _json_object(reply)
        status = payload.get("status")
        exact = _ECHOES[action].get(status) if isinstance(status, str) else None
        try:
            echoed = SinkTxnId.from_string(payload.get("txn"))  # type: ignore[arg-type]
        except TxnIdParseError:
            echoed = None
        if (
            exact is None
            or echoed is None
            or echoed.key != txn_id.key
            or (exact and echoed != txn_id)
        ):
            return Fatal.of(
                FatalError(
                    f"{what} answered {reply.status} without echoing the txn as the protocol "
                    f'requires ({{"txn": "{txn_id}", "status": ...}}): '
                    f"{_snippet(reply, secrets)}. A 2xx that is not the receiver's answer (a "
                    "proxy's page, another service) is never taken as OK."
                )
            )
        if status in ("committed", "already committed"):
            mismatch = self._log_mismatch(txn_id, action, payload)
            if mismatch is not None:  # (a Fatal is falsy: never `mismatch or OK`)
                return mismatch
            # The receiver's word for this log's commit: believed only as far
            # as the store decided (reconcile.core.claims).
            claim = Claim(self._name, f"HTTP sink {self._name!r}",
                          f"the receiver's answer at {self.base_url}", "commit", echoed.epoch,
                          generation=echoed.generation)  # fmt: skip
            untrusted = self._binding.untrusted(claim)
            if untrusted is not None:
                return untrusted
        return OK

    def _log_mismatch(
        self, txn_id: SinkTxnId, action: str, payload: Mapping[str, Any]
    ) -> SinkOutcome | None:
        """None if the receiver's commit is this writer's; else the Fatal that says whose."""
        found = payload.get("log_id")
        if found == self._binding.log_id:
            return None
        return foreign_commit(
            f"HTTP sink {self._name!r}",
            txn_id,
            action,
            found_txn=str(payload.get("txn"))[:200],
            found_log=found if isinstance(found, str) else None,
            log_id=self._binding.log_id,
            location=f"the receiver at {self.base_url}",
            advice=(
                "to write this pipeline's epochs again, have the receiver's operator remove "
                "that run's batches, or point the sink at another receiver or sink name."
            ),
        )


def _json_object(reply: Reply) -> dict[str, Any]:
    """The reply body as a JSON object; {} if it is not one (or was cut short)."""
    if reply.truncated:
        return {}
    try:
        payload = json.loads(reply.body)
    except ValueError:
        return {}
    return payload if isinstance(payload, dict) else {}


def _snippet(reply: Reply, secrets: Secrets) -> str:
    """At most _REASON_CHARS characters of the reply body, printable, credentials scrubbed."""
    text = secrets.scrub(reply.body.decode("utf-8", "replace"))
    shown = repr(text[:_REASON_CHARS])
    if len(text) > _REASON_CHARS or reply.truncated:
        shown += f" (cut at {_REASON_CHARS} characters)"
    return shown


def _shown_location(location: str | None, secrets: Secrets) -> str:
    """A redirect target as messages show it: no user info, query values hidden."""
    if not location:
        return "(no Location header)"
    parts = urlsplit(secrets.scrub(location[:_REASON_CHARS]))
    host = parts.hostname or ""
    try:
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        port = ""
    prefix = f"{parts.scheme}://{host}{port}" if parts.scheme else ""
    return repr(prefix + parts.path + ("?***" if parts.query else ""))
