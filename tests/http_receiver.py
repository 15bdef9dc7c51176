"""A reference receiver of the HTTP sink protocol (docs/http.md), run by tests on 127.0.0.1."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from reconcile.core.contract import SinkTxnId, TxnIdParseError
from sinks.http.sink import LOG_ID_HEADER
from sinks.memory.sink import CommitRecord


class ReceiverState:
    """What the receiver holds: prepared and committed batches, and the fence.

    ``prepared`` (by txn id) and ``committed`` (by (pipeline, sink, epoch)) are
    the keyed state; ``prepared_log_ids`` and ``committed_log_ids`` hold, under
    the same keys, the ``Reconcile-Log-Id`` the batch was prepared with (None
    if none). ``commit_log`` is append-only: one CommitRecord per commit the
    receiver performed (never for an "already committed" answer), so an epoch
    committed twice shows twice there although the keyed state holds it once.
    ``requests`` records (method, path, headers) of every request.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.prepared: dict[str, list[Any]] = {}
        self.committed: dict[tuple[str, str, int], tuple[str, list[Any]]] = {}
        self.generations: dict[tuple[str, str], int] = {}
        self.prepared_log_ids: dict[str, str | None] = {}
        self.committed_log_ids: dict[tuple[str, str, int], str | None] = {}
        self.commit_log: list[CommitRecord] = []
        self.requests: list[tuple[str, str, dict[str, str]]] = []

    def fenced(self, txn: SinkTxnId) -> bool:
        key = (txn.pipeline, txn.sink)
        if txn.generation < self.generations.get(key, 0):
            return True
        self.generations[key] = txn.generation
        return False

    def already_committed(self, txn: SinkTxnId) -> dict[str, Any]:
        """The reply to a prepare or commit of an epoch that is committed: whose it is."""
        held, _ = self.committed[txn.key]
        return {
            "status": "already committed",
            "txn": held,
            "log_id": self.committed_log_ids.get(txn.key),
        }


class _Handler(BaseHTTPRequestHandler):
    server: ReceiverServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _reply(self, status: int, payload: Any) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _route(self) -> str | None:
        """The path below the receiver's prefix, query dropped; None if refused (replied)."""
        state = self.server.state
        with state.lock:
            state.requests.append((self.command, self.path, dict(self.headers.items())))
        for name, value in self.server.required_headers.items():
            if self.headers.get(name) != value:
                self._reply(401, {"error": f"header {name} missing or wrong"})
                return None
        path = self.path.split("?", 1)[0]
        if not path.startswith(self.server.prefix + "/"):
            self._reply(404, {"error": f"no route {path}"})
            return None
        return path[len(self.server.prefix) :]

    def do_GET(self) -> None:
        path = self._route()
        if path is None:
            return
        state = self.server.state
        with state.lock:
            if path == "/pending":
                self._reply(200, sorted(state.prepared))
            elif path == "/committed":
                self._reply(
                    200,
                    [
                        {"txn": t, "rows": r, "log_id": state.committed_log_ids.get(k)}
                        for k, (t, r) in state.committed.items()
                    ],
                )
            elif path == "/commit-log":
                self._reply(
                    200,
                    [{"txn": c.txn, "rows": c.rows, "log_id": c.log_id} for c in state.commit_log],
                )
            else:
                self._reply(404, {"error": f"no route {path}"})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        path = self._route()
        if path is None:
            return
        log_id = self.headers.get(LOG_ID_HEADER)
        try:
            _, action, text = path.split("/", 2)
            txn = SinkTxnId.from_string(text)
        except (ValueError, TxnIdParseError) as exc:
            self._reply(400, {"error": str(exc)})
            return
        state = self.server.state
        with state.lock:
            if action == "prepare":
                if state.fenced(txn):
                    self._reply(409, {"error": "fenced", "txn": str(txn)})
                elif txn.key in state.committed:
                    self._reply(200, state.already_committed(txn))
                else:
                    rows = [json.loads(line) for line in body.splitlines() if line]
                    state.prepared[str(txn)] = rows
                    state.prepared_log_ids[str(txn)] = log_id
                    self._reply(200, {"status": "prepared", "txn": str(txn)})
            elif action == "commit":
                if txn.key in state.committed:
                    if state.committed_log_ids.get(txn.key) == log_id:
                        state.prepared.pop(str(txn), None)  # a stale leftover of this epoch
                        state.prepared_log_ids.pop(str(txn), None)
                    self._reply(200, state.already_committed(txn))
                elif state.fenced(txn):
                    self._reply(409, {"error": "fenced", "txn": str(txn)})
                elif str(txn) not in state.prepared:
                    self._reply(404, {"error": f"{txn} was never prepared"})
                elif state.prepared_log_ids.get(str(txn)) != log_id:
                    # Another progress log prepared this txn id: not this writer's batch.
                    self._reply(
                        409,
                        {
                            "error": "prepared by another progress log",
                            "txn": str(txn),
                            "log_id": state.prepared_log_ids.get(str(txn)),
                        },
                    )
                else:
                    rows = state.prepared.pop(str(txn))
                    state.prepared_log_ids.pop(str(txn), None)
                    state.committed[txn.key] = (str(txn), rows)
                    state.committed_log_ids[txn.key] = log_id
                    state.commit_log.append(CommitRecord(str(txn), list(rows), log_id))
                    self._reply(200, {"status": "committed", "txn": str(txn), "log_id": log_id})
            elif action == "abort":
                if txn.key in state.committed:
                    self._reply(409, {"error": f"{txn} is committed", "txn": str(txn)})
                else:
                    state.prepared.pop(str(txn), None)
                    state.prepared_log_ids.pop(str(txn), None)
                    self._reply(200, {"status": "aborted", "txn": str(txn)})
            else:
                self._reply(404, {"error": f"no action {action}"})


class ReceiverServer(ThreadingHTTPServer):
    """The receiver; its state outlives any sink client, as a real service's would.

    Args:
        prefix: the base path it serves under (e.g. "/api"); "" for the root.
        required_headers: headers every request must carry (else 401).
    """

    daemon_threads = True

    def __init__(self, prefix: str = "", required_headers: dict[str, str] | None = None) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.state = ReceiverState()
        self.prefix = prefix.rstrip("/")
        self.required_headers = dict(required_headers or {})
        self.thread = threading.Thread(
            target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}{self.prefix}"

    def __enter__(self) -> ReceiverServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
        self.server_close()
