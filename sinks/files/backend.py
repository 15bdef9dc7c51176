"""The files backend, as it declares itself to ``sinks.registry``.

Files on a local disk: ``file:///path``. It needs nothing beyond the base install.
"""

from __future__ import annotations

from sinks.base import Backend

__all__ = ["BACKEND"]

BACKEND = Backend(name="files", schemes=("file",), open="sinks.files.sink:open_uri")
