"""A reference HTTP receiver for the HTTP sink's protocol, run by the tests on 127.0.0.1."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from reconcile.contract import SinkTxnId, TxnIdParseError


class ReceiverState:
    """What the receiver holds: prepared and committed batches, and the fence."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.prepared: dict[str, list[Any]] = {}
        self.committed: dict[tuple[str, str, int], tuple[str, list[Any]]] = {}
        self.generations: dict[tuple[str, str], int] = {}

    def fenced(self, txn: SinkTxnId) -> bool:
        key = (txn.pipeline, txn.sink)
        if txn.generation < self.generations.get(key, 0):
            return True
        self.generations[key] = txn.generation
        return False


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

    def do_GET(self) -> None:
        state = self.server.state
        with state.lock:
            if self.path == "/pending":
                self._reply(200, sorted(state.prepared))
            elif self.path == "/committed":
                self._reply(200, [{"txn": t, "rows": r} for t, r in state.committed.values()])
            else:
                self._reply(404, {"error": f"no route {self.path}"})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        try:
            _, action, text = self.path.split("/", 2)
            txn = SinkTxnId.from_string(text)
        except (ValueError, TxnIdParseError) as exc:
            self._reply(400, {"error": str(exc)})
            return
        state = self.server.state
        with state.lock:
            if action == "prepare":
                if state.fenced(txn):
                    self._reply(409, {"error": "fenced"})
                elif txn.key in state.committed:
                    self._reply(200, {"status": "already committed"})
                else:
                    rows = [json.loads(line) for line in body.splitlines() if line]
                    state.prepared[str(txn)] = rows
                    self._reply(200, {"status": "prepared"})
            elif action == "commit":
                if txn.key in state.committed:
                    state.prepared.pop(str(txn), None)  # a stale leftover of this epoch
                    self._reply(200, {"status": "already committed"})
                elif state.fenced(txn):
                    self._reply(409, {"error": "fenced"})
                elif str(txn) in state.prepared:
                    state.committed[txn.key] = (str(txn), state.prepared.pop(str(txn)))
                    self._reply(200, {"status": "committed"})
                else:
                    self._reply(404, {"error": f"{txn} was never prepared"})
            elif action == "abort":
                if txn.key in state.committed:
                    self._reply(409, {"error": f"{txn} is committed"})
                else:
                    state.prepared.pop(str(txn), None)
                    self._reply(200, {"status": "aborted"})
            else:
                self._reply(404, {"error": f"no action {action}"})


class ReceiverServer(ThreadingHTTPServer):
    """The receiver; its state outlives any sink client, as a real service's would."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.state = ReceiverState()
        self.thread = threading.Thread(
            target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def __enter__(self) -> ReceiverServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
        self.server_close()
