"""Where PrometheusMetrics' series go: an HTTP ``/metrics`` endpoint, or a node_exporter textfile.

``HttpExporter`` serves one ``PrometheusMetrics``' own registry;
``TextfileExporter`` rewrites a ``*.prom`` file atomically. Split from
``reconcile.cli.prometheus`` (which re-exports both, and whose ``export`` starts
the one a config file's ``[metrics]`` table asks for) to keep the series'
names apart from how they leave the process.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Protocol

from prometheus_client import CollectorRegistry, start_http_server, write_to_textfile

from reconcile.core.contract import ConfigurationError

__all__ = ["Exported", "HttpExporter", "TextfileExporter"]


class Exported(Protocol):
    """What an exporter reads: a registry of series (``PrometheusMetrics`` has one)."""

    @property
    def registry(self) -> CollectorRegistry: ...


log = logging.getLogger("reconcile.prometheus")


class HttpExporter:
    """An HTTP ``/metrics`` endpoint serving one PrometheusMetrics' registry.

    Attributes:
        port: the port it listens on (the one chosen when 0 was asked).
        url: ``http://addr:port/metrics``.
    """

    def __init__(self, metrics: Exported, port: int = 0, addr: str = "127.0.0.1") -> None:
        self.metrics = metrics
        try:
            self._server, self._thread = start_http_server(port, addr, registry=metrics.registry)
        except OSError as err:
            raise ConfigurationError(f"metrics: cannot listen on {addr}:{port}: {err}") from err
        self.addr = addr
        self.port: int = self._server.server_port
        self.url = f"http://{addr}:{self.port}/metrics"

    def close(self) -> None:
        """Stop serving and free the port."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> HttpExporter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class TextfileExporter:
    """Writes one PrometheusMetrics to a ``*.prom`` file for node_exporter's textfile collector.

    Each write goes to a temporary file in the same folder, then replaces the
    file (prometheus-client's ``write_to_textfile``): the collector never reads
    half a file. With ``interval_s`` a background thread rewrites it that often;
    ``flush()`` writes now, ``close()`` writes a last time.
    """

    def __init__(
        self, metrics: Exported, path: str | Path, *, interval_s: float | None = 15.0
    ) -> None:
        self.metrics = metrics
        self.path = Path(path)
        if self.path.suffix != ".prom":
            raise ConfigurationError(
                f"metrics: textfile {str(self.path)!r} must end in .prom (node_exporter's "
                "textfile collector reads only those)"
            )
        if not self.path.parent.is_dir():
            raise ConfigurationError(
                f"metrics: textfile folder {str(self.path.parent)!r} is missing"
            )
        if interval_s is not None and interval_s <= 0:
            raise ConfigurationError(f"metrics: interval_s must be > 0, got {interval_s}")
        self.interval_s = interval_s
        self.writes = 0
        self.written = threading.Event()  # set by each background write
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if interval_s is not None:
            self._thread = threading.Thread(
                target=self._loop, name="reconcile-textfile", daemon=True
            )
            self._thread.start()

    def flush(self) -> None:
        """Write the file now (atomically)."""
        write_to_textfile(str(self.path), self.metrics.registry)
        self.writes += 1

    def _loop(self) -> None:
        assert self.interval_s is not None
        while not self._stop.wait(self.interval_s):
            try:
                self.flush()
                self.written.set()
            except OSError as err:
                log.warning("metrics: cannot write %s: %s", self.path, err)

    def close(self) -> None:
        """Stop the background writes and write a last time."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.flush()

    def __enter__(self) -> TextfileExporter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
