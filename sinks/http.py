"""HTTP two-phase-commit sink: POST /prepare, /commit, /abort per txn; GET /pending to recover."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterable, Sequence
from typing import Any

from reconcile.contract import (
    OK,
    ConfigurationError,
    Fatal,
    FatalError,
    Retryable,
    RetryableError,
    SinkOutcome,
    SinkTxnId,
    TxnIdParseError,
    validate_name,
)

__all__ = ["HttpSink"]


class HttpSink:
    """A TwoPhaseSink that speaks a small REST protocol to a receiver.

    - ``POST {base}/prepare/{txn}`` with the batch as JSON lines: the receiver
      makes it durable but invisible;
    - ``POST {base}/commit/{txn}``: visible, atomically; 200 if already committed;
    - ``POST {base}/abort/{txn}``: discard; 200 if unknown;
    - ``GET {base}/pending``: a JSON list of prepared, uncommitted txn ids.

    Status codes map to outcomes: 2xx is OK; 409 (fenced or conflicting) and
    other 4xx are Fatal; 5xx, timeouts and connection errors are Retryable
    (every call is idempotent, so repeating one whose reply was lost is safe).
    """

    def __init__(self, name: str, base_url: str, *, timeout_s: float = 10.0) -> None:
        self._name = validate_name("sink", name)
        if not base_url.startswith(("http://", "https://")):
            raise ConfigurationError(
                f"sink {name!r}: base URL must be http(s)://, got {base_url!r}"
            )
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self._staged: dict[SinkTxnId, bytes] = {}

    @property
    def name(self) -> str:
        return self._name

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
        outcome = self._post(f"prepare/{txn_id}", body)
        if outcome:
            del self._staged[txn_id]
        return outcome

    def commit(self, txn_id: SinkTxnId) -> SinkOutcome:
        return self._post(f"commit/{txn_id}", b"")

    def abort(self, txn_id: SinkTxnId) -> SinkOutcome:
        self._staged.pop(txn_id, None)
        return self._post(f"abort/{txn_id}", b"")

    def recover(self) -> Sequence[SinkTxnId]:
        status, body = self._request("GET", "pending", None)
        if status is None or status >= 500:
            raise RetryableError(f"sink {self._name!r}: GET pending failed: {body!r}")
        if status >= 300:
            raise FatalError(f"sink {self._name!r}: GET pending answered {status}: {body!r}")
        txns = []
        for text in json.loads(body):
            try:
                txn = SinkTxnId.from_string(text)
            except TxnIdParseError:
                continue  # not a txn of this engine
            if txn.sink == self._name:  # one receiver may serve several sinks
                txns.append(txn)
        return txns

    def _post(self, path: str, body: bytes) -> SinkOutcome:
        status, reply = self._request("POST", path, body)
        if status is None or status >= 500:
            return Retryable(f"POST {path}: {reply!r}")
        if status >= 300:
            return Fatal(f"POST {path} answered {status}: {reply[:200]!r}")
        return OK

    def _request(self, method: str, path: str, body: bytes | None) -> tuple[int | None, bytes]:
        request = urllib.request.Request(
            f"{self.base_url}/{path}",
            data=body,
            method=method,
            headers={"Content-Type": "application/x-ndjson"},
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()
        except (urllib.error.URLError, OSError) as exc:
            return None, str(exc).encode()
